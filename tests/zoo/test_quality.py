"""Held-out reference scoring: where the answer starts, and exact losses on oracle models."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import mlx.core as mx
import pytest

from toolflash.zoo.corpus import eval_prompts
from toolflash.zoo.quality import reference_tokens, score_references


@pytest.mark.parametrize("kind", ["tool_call", "json", "code"])
def test_answer_starts_where_the_prompt_ends(hf_tokenizer: Any, kind: str) -> None:
    prompt = eval_prompts(kind, n=1)[0]  # type: ignore[arg-type]
    ids, start = reference_tokens(prompt, hf_tokenizer)
    prompt_ids = hf_tokenizer.encode(prompt.render(hf_tokenizer), add_special_tokens=False)
    assert ids[:start] == prompt_ids[:start] and start >= len(prompt_ids) - 8
    answer = hf_tokenizer.decode(ids[start:])
    assert answer.rstrip().endswith("<|im_end|>")
    for call in prompt.reference.get("tool_calls") or []:  # type: ignore[union-attr]
        assert call["function"]["name"] in answer
    content = prompt.reference.get("content") or ""  # type: ignore[union-attr]
    assert content.strip()[:20] in answer


def test_prompt_without_reference_is_refused(hf_tokenizer: Any) -> None:
    prompt = dataclasses.replace(eval_prompts("json", n=1)[0], reference=None)
    with pytest.raises(ValueError, match="no reference"):
        reference_tokens(prompt, hf_tokenizer)


class Oracle:
    """A 'model' whose logits put everything on the true next token of one known sequence."""

    def __init__(self, ids: list[int], vocab: int) -> None:
        self.ids, self.vocab = ids, vocab

    def __call__(self, tokens: mx.array) -> mx.array:
        n = tokens.shape[1]
        assert tokens[0].tolist() == self.ids[:n]  # the scorer feeds the sequence minus its last
        hot = mx.array(self.ids[1 : n + 1])[:, None] == mx.arange(self.vocab)[None, :]
        return (hot.astype(mx.float32) * 50.0)[None]


def test_scores_are_exact_for_oracle_and_uniform_models(hf_tokenizer: Any) -> None:
    prompt = eval_prompts("tool_call", n=1)[0]
    ids, start = reference_tokens(prompt, hf_tokenizer)
    vocab = len(hf_tokenizer)
    (oracle,) = score_references(Oracle(ids, vocab), hf_tokenizer, [prompt])
    assert oracle.kind == "tool_call" and oracle.prompts == 1
    assert oracle.answer_tokens == len(ids) - start and oracle.mean_context == len(ids)
    assert oracle.nll == pytest.approx(0.0, abs=1e-4) and oracle.top1 == 1.0

    def uniform(tokens: mx.array) -> mx.array:
        return mx.zeros((1, tokens.shape[1], vocab))

    (flat,) = score_references(uniform, hf_tokenizer, [prompt])
    assert flat.nll == pytest.approx(math.log(vocab), rel=1e-4)


def _run_zoo(argv: list[str]) -> int:
    import argparse

    from toolflash.commands import zoo as zoo_command

    parser = argparse.ArgumentParser()
    zoo_command.add_arguments(parser)
    return zoo_command.run(parser.parse_args(argv))


def test_score_and_sample_commands_on_the_embedded_hybrid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from toolflash.engine.factory import assets_dir

    model = str(assets_dir() / "qwen35-tiny")
    assert _run_zoo(["score", "--model", model, "-n", "2"]) == 0
    scores = {s["kind"]: s for s in json.loads(capsys.readouterr().out)["scores"]}
    assert set(scores) == {"free_text", "code", "tool_call", "json"}
    # A trained target predicts the tool-call and JSON answers far better than chance (log 4096).
    assert scores["tool_call"]["nll"] < 2.5 and scores["json"]["nll"] < 2.5
    assert _run_zoo(["sample", "--model", model, "--kind", "tool_call", "-n", "2",
                     "--max-tokens", "48"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("=== tool_call") == 2 and "first call names the reference's tool: " in out
