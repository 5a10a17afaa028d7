"""Quality checks on a target: do its samples' tool calls and JSON answers parse, and how well
does it predict the reference answers of held-out prompts?"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from toolflash.zoo.records import Prompt, ToolCallFormat

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FENCE = re.compile(r"```(?:json)?\n(.*?)\n```", re.S)


@dataclass(frozen=True)
class ToolCallCheck:
    """Tool-call blocks found in a sample, how many parsed, and whether each names an offered tool."""

    blocks: int
    parsed: list[dict[str, Any]]
    known_names: bool

    @property
    def well_formed(self) -> bool:
        return self.blocks > 0 and len(self.parsed) == self.blocks and self.known_names


def check_tool_calls(
    text: str, fmt: ToolCallFormat, tools: list[dict[str, Any]] | None
) -> ToolCallCheck:
    """Parse every `<tool_call>` block of `text` with mlx-lm's parser for `fmt`."""
    from mlx_lm.tool_parsers import json_tools, qwen3_coder

    parser = qwen3_coder if fmt == "qwen3_coder" else json_tools
    blocks = _BLOCK.findall(text)
    parsed: list[dict[str, Any]] = []
    opened = text.count("<tool_call>")  # an unterminated call counts as a failed one
    for block in blocks:
        try:
            call = parser.parse_tool_call(block, tools)
        except (ValueError, json.JSONDecodeError):
            continue
        if isinstance(call, dict) and "name" in call:
            parsed.append(call)
    names = {t["function"]["name"] for t in tools or []}
    return ToolCallCheck(opened, parsed, all(c["name"] in names for c in parsed))


def parses_as_json(text: str) -> bool:
    """True when the answer (after any think block, inside any ```json fence) is a JSON value."""
    body = text.split("</think>")[-1].strip()
    fenced = _FENCE.search(body)
    try:
        json.loads(fenced.group(1) if fenced else body)
    except json.JSONDecodeError:
        return False
    return True


@dataclass(frozen=True)
class ReferenceScore:
    """How well a target predicts the corpus's reference answers to held-out prompts of a kind:
    mean negative log-likelihood and top-1 accuracy per answer token, teacher-forced after the
    whole prompt (tools list and all), so it measures the answer conditioned on the request."""

    kind: str
    prompts: int
    answer_tokens: int
    nll: float
    top1: float
    mean_context: int


def reference_tokens(prompt: Prompt, tokenizer: Any) -> tuple[list[int], int]:
    """The prompt followed by its reference answer, as ids, and where the answer starts.

    The answer starts where the rendered conversation leaves the rendered prompt (the template
    may render a past assistant turn's opening differently from the generation prompt).
    """
    if prompt.reference is None:
        raise ValueError("the prompt has no reference answer")
    prompt_ids = tokenizer.encode(prompt.render(tokenizer), add_special_tokens=False)
    full_text = tokenizer.apply_chat_template(
        [*prompt.messages, prompt.reference], tokenize=False, **prompt.chat_kwargs()
    )
    full_ids = tokenizer.encode(full_text, add_special_tokens=False)
    start = 0
    while start < min(len(prompt_ids), len(full_ids)) and prompt_ids[start] == full_ids[start]:
        start += 1
    return list(full_ids), max(start, 1)


def score_references(model: Any, tokenizer: Any, prompts: list[Prompt]) -> list[ReferenceScore]:
    """`ReferenceScore` per prompt kind (in first-seen order) for an mlx-lm `model`."""
    import mlx.core as mx
    import mlx.nn as nn

    # Per kind, per prompt: (answer tokens, summed NLL, top-1 hits, context length).
    rows: dict[str, list[tuple[int, float, float, int]]] = {}
    for prompt in prompts:
        ids, start = reference_tokens(prompt, tokenizer)
        tokens = mx.array(ids)[None]
        logits = model(tokens[:, :-1])[0, start - 1 :].astype(mx.float32)
        labels = tokens[0, start:]
        nll = nn.losses.cross_entropy(logits, labels, reduction="sum")
        hits = (mx.argmax(logits, axis=-1) == labels).sum()
        row = (labels.size, float(nll.item()), float(hits.item()), len(ids))  # type: ignore[arg-type]
        rows.setdefault(prompt.kind, []).append(row)
    scores = []
    for kind, kind_rows in rows.items():
        answered, nll_sum, hit_sum, context = (sum(column) for column in zip(*kind_rows))
        scores.append(
            ReferenceScore(
                kind,
                len(kind_rows),
                int(answered),
                round(nll_sum / answered, 4),
                round(hit_sum / answered, 4),
                round(context / len(kind_rows)),
            )
        )
    return scores
