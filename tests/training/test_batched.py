"""Batched distillation equals the per-prompt engine path token for token (float32, CPU)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target
from toolflash.training.batched import batched_continuations
from toolflash.training.data import PromptRecord, distill
from toolflash.training.generation import generate

from ..engine.tiny_models import VOCAB, qwen3_target, qwen35_target

LENGTHS = (1, 3, 5, 9, 12, 17, 26, 40, 63)
MAX_NEW = 24


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, VOCAB - 8, size=n)] for n in LENGTHS]


def _stops(target: Any, prompts: list[list[int]]) -> set[int]:
    """Stop ids that end some continuations early and leave others at the length limit."""
    free = [generate(target, p, MAX_NEW, ()).output for p in prompts]
    stops = {free[1][4], free[4][10]}
    assert any(not stops & set(out) for out in free), "every prompt would stop: pick other ids"
    return stops


Case = tuple[Any, list[list[int]], set[int], list[list[int]]]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def case(request: pytest.FixtureRequest) -> Case:
    """(target, prompts, stop ids, per-prompt engine continuations)."""
    qwen3 = request.param == "qwen3"
    target: Any = Qwen3Target(qwen3_target()) if qwen3 else Qwen35Target(qwen35_target())
    prompts = _prompts()
    stops = _stops(target, prompts)
    return target, prompts, stops, [generate(target, p, MAX_NEW, stops).output for p in prompts]


# (decode batch, prefill group): slots refilled as sequences finish; padded prefill groups.
@pytest.mark.parametrize(("batch_size", "prefill_group"), [(3, 1), (4, 4), (64, 8)])
def test_batched_equals_per_prompt(case: Case, batch_size: int, prefill_group: int) -> None:
    target, prompts, stops, reference = case
    finished: list[int] = []
    batched = batched_continuations(
        target.model,
        prompts,
        MAX_NEW,
        stops,
        batch_size,
        on_done=lambda i, out: finished.append(i),
        prefill_group=prefill_group,
    )
    assert batched == reference
    assert sorted(finished) == list(range(len(prompts)))
    # Both finish reasons occur: the stop token kept last, or exactly MAX_NEW tokens.
    assert any(out[-1] in stops and len(out) < MAX_NEW for out in batched)
    assert any(len(out) == MAX_NEW and not stops & set(out) for out in batched)
    assert all(not stops & set(out[:-1]) for out in batched)


def test_distill_batched_equals_per_prompt() -> None:
    target = Qwen3Target(qwen3_target())
    prompts = _prompts(seed=1)
    stops = _stops(target, prompts)
    records: list[PromptRecord | list[int]] = [*prompts, PromptRecord((1, 2, 3), "chat", (4, 5))]
    one = distill(target, records, stops, MAX_NEW, max_len=40, progress=False, batch_size=1)
    many = distill(target, records, stops, MAX_NEW, max_len=40, progress=False, batch_size=4)
    assert len(one) == len(many) == len(records)
    for a, b in zip(one, many, strict=True):
        assert a.tokens.tolist() == b.tokens.tolist()
        assert (a.prompt_len, a.kind) == (b.prompt_len, b.kind)
    # A record that carries a response keeps it in either path.
    assert many[-1].tokens.tolist() == [1, 2, 3, 4, 5] and many[-1].kind == "chat"


def test_bad_arguments() -> None:
    model = qwen3_target()
    with pytest.raises(ValueError, match="max_new_tokens"):
        batched_continuations(model, [[1, 2]], 0, ())
    with pytest.raises(ValueError, match="empty prompt"):
        batched_continuations(model, [[1], []], 4, ())
    with pytest.raises(ValueError, match="batch size"):
        distill(Qwen3Target(model), [[1, 2]], (), 4, progress=False, batch_size=0)
    assert batched_continuations(model, [], 4, ()) == []
