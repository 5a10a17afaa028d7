"""Drafter training data: prompts, and the target's own greedy continuations (distillation).

Inputs (a file, or a directory searched recursively for `*.jsonl`, `*.json` and `*.txt`):
- chat requests, one JSON object per line: `{"messages": [...], "tools": [...]}` (optional
  `chat_template_kwargs`, `enable_thinking`, `tool_call_format`, `kind`), rendered with the target tokenizer's chat
  template; a conversation ending with an assistant message is the prompt before that message
  plus that message as its recorded response;
- plain text prompts: `{"prompt": "..."}` or `{"text": "..."}` lines, a JSON string per line, or
  a `.txt` file (the whole file is one prompt), tokenized as-is;
- recorded gateway traffic: `{"request": {...chat request...}, "response": {...}}` where the
  response is an OpenAI chat completion (`choices[0].message`) or an assistant message. With
  `use_recorded` the recorded assistant output is the training response, else the target
  regenerates it from the request.

Each example is prompt + response tokens with the loss on the response only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from tqdm import tqdm

from toolflash.engine.targets.base import TargetAdapter

from .batched import batched_continuations
from .generation import generate

log = structlog.get_logger(__name__)

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>")
# Chat template options a record may carry at its top level (toolflash's zoo corpus does).
TEMPLATE_KWARGS = ("enable_thinking", "tool_call_format")


class DataError(ValueError):
    """Training data that cannot be read or rendered."""


@dataclass(frozen=True)
class PromptRecord:
    """A tokenized prompt, its kind (for per-kind reports) and an optional given response."""

    tokens: tuple[int, ...]
    kind: str
    response: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TrainingExample:
    """prompt + response tokens; the loss applies to positions >= prompt_len."""

    tokens: np.ndarray  # [S] int32
    prompt_len: int
    kind: str = "text"

    @property
    def loss_mask(self) -> np.ndarray:
        mask = np.zeros(self.tokens.size, dtype=bool)
        mask[self.prompt_len :] = True
        return mask

    @property
    def response_len(self) -> int:
        return int(self.tokens.size - self.prompt_len)


def stop_token_ids(tokenizer: Any) -> set[int]:
    """EOS ids of the tokenizer plus the chat end-of-turn tokens it knows."""
    ids: set[int] = set()
    for attr in ("eos_token_ids", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, Iterable) and not isinstance(value, str):
            ids.update(int(v) for v in value)
    vocab = _vocab(tokenizer)
    ids.update(vocab[name] for name in END_OF_TURN_TOKENS if name in vocab)
    return ids


def _vocab(tokenizer: Any) -> dict[str, int]:
    # An mlx-lm TokenizerWrapper forwards attribute access to the HF tokenizer.
    get_vocab = getattr(tokenizer, "get_vocab", None)
    return dict(get_vocab()) if get_vocab else {}


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None,
    generation_prompt: bool,
    kwargs: Mapping[str, Any],
) -> str:
    try:
        text = tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **kwargs,
        )
    except Exception as exc:  # jinja/template errors come in many types
        raise DataError(f"chat template failed on a request: {exc}") from exc
    return str(text)


def _assistant_message(response: Any) -> Mapping[str, Any] | None:
    """The assistant message of a recorded response (chat completion or bare message)."""
    if not isinstance(response, Mapping):
        return None
    choices = response.get("choices")
    if isinstance(choices, list) and choices:
        message = choices[0].get("message")
        return message if isinstance(message, Mapping) else None
    if "role" in response or "content" in response or "tool_calls" in response:
        return response
    return None


def chat_record(
    tokenizer: Any,
    request: Mapping[str, Any],
    response: Any = None,
    use_recorded: bool = False,
    kind: str | None = None,
) -> PromptRecord:
    """Render a chat request (and, with `use_recorded`, its recorded assistant output)."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DataError("chat request without messages")
    if response is None and messages[-1].get("role") == "assistant" and len(messages) > 1:
        # A conversation that ends with the assistant's turn: the prompt is everything
        # before it, the turn itself is the recorded response.
        messages, response = messages[:-1], messages[-1]
    tools = request.get("tools") or None
    kwargs = dict(request.get("chat_template_kwargs") or {})
    for key in TEMPLATE_KWARGS:
        if key in request:
            kwargs.setdefault(key, request[key])
    prompt_text = _render(tokenizer, messages, tools, True, kwargs)
    prompt = _encode(tokenizer, prompt_text)
    kind = kind or ("tool" if tools else "chat")
    if not use_recorded:
        return PromptRecord(tuple(prompt), kind)
    message = _assistant_message(response)
    if message is None:
        raise DataError("use_recorded: the record has no recorded assistant message")
    full_text = _render(
        tokenizer, [*messages, {"role": "assistant", **message}], tools, False, kwargs
    )
    if full_text.startswith(prompt_text):
        # Render the whole conversation and keep the suffix: the assistant turn exactly as the
        # template writes it (tool-call markup, end-of-turn token), i.e. what serving sees.
        reply = _encode(tokenizer, full_text[len(prompt_text) :])
        # Serving stops at the end-of-turn token; what the template writes after it is
        # never generated.
        ends = [i for i, t in enumerate(reply) if t in stop_token_ids(tokenizer)]
        reply = reply[: ends[0] + 1] if ends else reply
    else:
        # Templates that rewrite earlier turns (e.g. drop <think>) break the prefix property.
        reply = _encode(tokenizer, str(message.get("content") or ""))
        end = _vocab(tokenizer).get("<|im_end|>")
        if end is not None:
            reply.append(end)
    return PromptRecord(tuple(prompt), kind, tuple(reply))


def _records_in_file(path: Path, tokenizer: Any, use_recorded: bool) -> Iterator[PromptRecord]:
    if path.suffix == ".txt":
        yield PromptRecord(tuple(_encode(tokenizer, path.read_text())), "text")
        return
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{n}: not JSON: {exc}") from exc
        try:
            yield _record_from_json(obj, tokenizer, use_recorded)
        except DataError as exc:
            raise DataError(f"{path}:{n}: {exc}") from exc


def _record_from_json(obj: Any, tokenizer: Any, use_recorded: bool) -> PromptRecord:
    if isinstance(obj, str):
        return PromptRecord(tuple(_encode(tokenizer, obj)), "text")
    if not isinstance(obj, Mapping):
        raise DataError("expected a JSON object or string")
    kind = obj.get("kind")
    if isinstance(obj.get("request"), Mapping):
        return chat_record(tokenizer, obj["request"], obj.get("response"), use_recorded, kind)
    if obj.get("messages"):
        return chat_record(tokenizer, obj, obj.get("response"), use_recorded, kind)
    for key in ("prompt", "text"):
        if isinstance(obj.get(key), str):
            return PromptRecord(tuple(_encode(tokenizer, obj[key])), kind or "text")
    raise DataError("record has none of: messages, request, prompt, text")


def load_prompt_records(
    path: Path, tokenizer: Any, use_recorded: bool = False
) -> list[PromptRecord]:
    """All prompts under `path` (file or directory), in sorted file order."""
    path = Path(path)
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and p.suffix in {".jsonl", ".json", ".txt"}
        )
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"no training data at {path}")
    records = [r for f in files for r in _records_in_file(f, tokenizer, use_recorded)]
    records = [r for r in records if r.tokens]
    if not records:
        raise DataError(f"no prompts found in {path}")
    return records


def as_records(prompts: Sequence[PromptRecord | Sequence[int]]) -> list[PromptRecord]:
    """Accept token sequences (the Python API used by the zoo builder) as text-kind records."""
    return [
        p if isinstance(p, PromptRecord) else PromptRecord(tuple(int(t) for t in p), "text")
        for p in prompts
    ]


def example_from(
    prompt: Sequence[int], response: Sequence[int], kind: str, max_len: int
) -> TrainingExample | None:
    """prompt + response, the response cut to fit `max_len` and the prompt left-truncated to
    the rest. None when fewer than 2 response tokens remain (no valid anchor)."""
    response = list(response)[: max_len - 1]
    if len(response) < 2:
        return None
    prompt = list(prompt)[-(max_len - len(response)) :]
    tokens = np.array(prompt + response, dtype=np.int32)
    return TrainingExample(tokens, len(prompt), kind)


def distill(
    target: TargetAdapter,
    prompts: Sequence[PromptRecord | Sequence[int]],
    stop_ids: Iterable[int],
    max_new_tokens: int = 256,
    max_len: int = 512,
    progress: bool = True,
    batch_size: int = 1,
) -> list[TrainingExample]:
    """Training examples from the target's own greedy continuations of `prompts` (records that
    carry a response keep it). Stops at a stop id (kept as the last response token) or after
    `max_new_tokens`. `batch_size` > 1 decodes that many prompts per forward through mlx-lm's
    batch generator (`batched.py`, same tokens); 1 runs one engine session per prompt."""
    if batch_size < 1:
        raise ValueError(f"distillation batch size must be >= 1, got {batch_size}")
    stops = set(stop_ids)
    records = as_records(prompts)
    todo = [i for i, r in enumerate(records) if r.response is None]
    responses: dict[int, Sequence[int]] = {
        i: r.response for i, r in enumerate(records) if r.response is not None
    }
    bar = tqdm(total=len(todo), desc="distill", unit="prompt", disable=not progress)
    generated = 0

    def done(i: int, output: Sequence[int]) -> None:
        nonlocal generated
        responses[i] = output
        generated += len(output)
        bar.update(1)
        bar.set_postfix(tokens=generated)

    t0 = time.perf_counter()
    if batch_size > 1 and todo:
        batched_continuations(
            target.model,
            [records[i].tokens for i in todo],
            max_new_tokens,
            stops,
            batch_size,
            on_done=lambda j, output: done(todo[j], output),
        )
    else:
        for i in todo:
            done(i, generate(target, records[i].tokens, max_new_tokens, stops).output)
    seconds = time.perf_counter() - t0
    bar.close()
    examples = [
        ex
        for i, r in enumerate(records)
        if (ex := example_from(r.tokens, responses[i], r.kind, max_len)) is not None
    ]
    log.info(
        "distilled",
        prompts=len(records),
        examples=len(examples),
        generated=generated,
        seconds=round(seconds, 2),
        tokens_per_s=round(generated / seconds, 1) if seconds > 0 else None,
        batch_size=batch_size,
    )
    return examples


def split_holdout(
    records: Sequence[PromptRecord], count: int, seed: int
) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """(train, held-out): `count` records drawn at random, stratified by kind so every kind
    present gets held-out prompts when count allows."""
    rng = np.random.default_rng(seed)
    by_kind: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_kind.setdefault(r.kind, []).append(i)
    held: set[int] = set()
    kinds = sorted(by_kind)
    order = {k: list(rng.permutation(by_kind[k])) for k in kinds}
    while len(held) < min(count, len(records) - 1):
        progressed = False
        for k in kinds:
            # Keep at least one training prompt of each kind.
            if len(order[k]) > 1 and len(held) < count:
                held.add(int(order[k].pop()))
                progressed = True
        if not progressed:
            break
    train = [r for i, r in enumerate(records) if i not in held]
    holdout = [r for i, r in enumerate(records) if i in held]
    return train, holdout


def subsample(records: Sequence[PromptRecord], count: int, seed: int) -> list[PromptRecord]:
    """`count` records drawn at random (files are often grouped by kind), in file order."""
    if count >= len(records):
        return list(records)
    keep = sorted(np.random.default_rng(seed).permutation(len(records))[:count].tolist())
    return [records[i] for i in keep]
