"""Session state export/restore: resuming from any prefix equals a cold run (both families,
both modes), and states never change when the restored session decodes on."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from toolflash.cache.state import SessionState
from toolflash.engine.api import Mode
from toolflash.engine.draft_context import DraftWindow
from toolflash.engine.session import GenerationSession
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target

from .tiny_models import drafter_for, qwen3_target, qwen35_target

PROMPT = [3, 17, 42, 99, 7, 7, 250, 12, 64, 5, 88, 31, 9, 140, 2, 77, 18, 19, 20, 21]
N = 48


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def pair(request: Any) -> tuple[Any, Any]:
    if request.param == "qwen3":
        model = qwen3_target()
        return Qwen3Target(model), drafter_for(model)
    model = qwen35_target()
    return Qwen35Target(model), drafter_for(model)


def decode(session: GenerationSession, mode: Mode, n: int = N) -> list[int]:
    start = len(session.tokens)
    while len(session.tokens) < start + n:
        session.step(mode, 8, lambda c: None)
    return session.tokens[start - 1 : start + n]


def fresh(pair: Any) -> GenerationSession:
    target, drafter = pair
    return GenerationSession(
        target, drafter, window=DraftWindow(sink=4, window=12), prefill_chunk=7
    )


@pytest.mark.parametrize("mode", ["spec", "ar"])
@pytest.mark.parametrize("cut", [1, 9, 20])
def test_restore_from_prefill_snapshot_equals_cold(pair: Any, mode: Mode, cut: int) -> None:
    cold = fresh(pair)
    cold.prefill(PROMPT)
    want = decode(cold, mode)

    states: list[SessionState] = []
    first = fresh(pair)
    first.prefill(PROMPT, publish_at=[cut], publish=states.append)
    assert [len(s.tokens) for s in states] == [cut]
    state = states[0]
    before = [mx.array(a) for a in state.arrays()]

    warm = fresh(pair)
    warm.prefill(PROMPT, restore=state)
    assert decode(warm, mode) == want
    # The state is a value: decoding from it left it unchanged, so it can be reused.
    for a, b in zip(before, state.arrays(), strict=True):
        assert mx.array_equal(a, b).item()
    again = fresh(pair)
    again.prefill(PROMPT, restore=state)
    assert decode(again, mode) == want


def test_end_of_request_state_resumes_the_next_turn(pair: Any) -> None:
    turn1 = fresh(pair)
    turn1.prefill(PROMPT)
    decode(turn1, "spec", 30)
    state = turn1.export_state()
    assert state.tokens == tuple(turn1.tokens[: turn1.fed])
    next_prompt = [*turn1.tokens, 5, 6, 7]  # the staged token, then the next user turn

    cold = fresh(pair)
    cold.prefill(next_prompt)
    want = decode(cold, "spec")
    warm = fresh(pair)
    warm.prefill(next_prompt, restore=state)
    assert decode(warm, "spec") == want


def test_restore_at_exact_prompt_uses_stored_logits(pair: Any) -> None:
    first = fresh(pair)
    token = first.prefill(PROMPT)
    state = first.export_state()
    warm = fresh(pair)
    assert warm.prefill(PROMPT, restore=state) == token


def test_restore_rejects_non_prefix_and_other_window(pair: Any) -> None:
    first = fresh(pair)
    first.prefill(PROMPT)
    state = first.export_state()
    with pytest.raises(ValueError, match="not a prefix"):
        fresh(pair).prefill([1, *PROMPT], restore=state)
    target, drafter = pair
    other = GenerationSession(target, drafter, window=DraftWindow(sink=4, window=99))
    with pytest.raises(ValueError, match="sink/window"):
        other.prefill(PROMPT, restore=state)
