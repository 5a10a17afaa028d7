"""The request loop's seams: the session's commits of a batched forward's row commit what its
own AR step and spec cycle commit, and `ModeControl` counts a batched row's step without
letting the controller judge it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx
import pytest

from toolflash.engine.api import CycleRecord, GenerationRequest, ModeDecision
from toolflash.engine.draft_length import REJECTIONS_TO_SHRINK
from toolflash.engine.mode_control import ModeControl
from toolflash.engine.session import GenerationSession
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target
from toolflash.engine.verify_cycle import cut_at_stop

from .tiny_models import drafter_for, qwen3_target, qwen35_target

PROMPT = [3, 17, 42, 99, 7, 7, 250, 12, 64, 5, 88, 31]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def pair(request: Any) -> tuple[Any, Any]:
    model = qwen3_target() if request.param == "qwen3" else qwen35_target()
    adapter = Qwen3Target(model) if request.param == "qwen3" else Qwen35Target(model)
    return adapter, drafter_for(model)


def never(_: Sequence[int]) -> int | None:
    return None


def same(a: CycleRecord, b: CycleRecord) -> bool:
    """Equal but for the timings and the batch size."""
    timing = {"draft_s": 0.0, "verify_s": 0.0, "rollback_s": 0.0, "rows": 1}
    return replace(a, **timing) == replace(b, **timing)  # type: ignore[arg-type]


def batched_ar(session: GenerationSession) -> CycleRecord:
    """One AR step as the scheduler runs it: its own forward, the session commits the row."""
    res = session.target.forward(mx.array([[session.staged]]), session.cache, session.capture)
    logits = res.logits[0, -1]
    token = int(mx.argmax(logits).item())
    step = session.commit_batched_token(token, logits, res.features, never, 0.0, 2)
    assert step.tokens == [token] and not step.finished
    return step.record


def batched_spec(session: GenerationSession, block: int) -> CycleRecord:
    """One spec cycle as the scheduler runs it: the session's proposal verified in a forward
    of its own, the cache rolled back to the kept rows, the session commits the block."""
    proposal = session.propose(block)
    res = session.feed_block(proposal.tokens)
    verdict = session.chooser.verify(proposal, res.logits[0])
    committed, end = cut_at_stop(verdict.tokens, never)
    keep = min(verdict.accepted, len(committed) - 1) + 1
    session.target.rollback(session.cache, res, keep)
    judged = (committed, verdict.accepted, end)
    step = session.commit_batched_block(
        proposal, judged, res.logits[0], res.features, (0.0, 0.0, 0.0), block, 2
    )
    assert step.record.rows == 2
    return step.record


def test_batched_commits_equal_the_sessions_own_steps(pair: tuple[Any, Any]) -> None:
    """Alternating AR and spec steps: the session's own and the batched commits leave the
    same tokens, records and state (the drafter's context too: the next drafts, and so the
    accepted counts, depend on the features each commit keeps)."""
    target, drafter = pair
    own = GenerationSession(target, drafter)
    rows = GenerationSession(target, drafter)
    own.prefill(PROMPT)
    rows.prefill(PROMPT)
    for i in range(12):
        if i % 3 == 2:
            a = own.step("spec", 8, never).record
            b = batched_spec(rows, 8)
        else:
            a = own.step("ar", 8, never).record
            b = batched_ar(rows)
        assert same(a, b), (i, a, b)
        assert own.tokens == rows.tokens and own.fed == rows.fed
    assert mx.array_equal(own.last_logits, rows.last_logits)  # type: ignore[arg-type]


class Recorder:
    """A controller that keeps spec at block 8 and counts the steps it is shown."""

    def __init__(self) -> None:
        self.judged = 0

    def prepare(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> None:
        pass

    def observe_prefix(self, text: str) -> None:
        pass

    def start(
        self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0
    ) -> ModeDecision:
        return ModeDecision("spec", 8)

    def after_step(self, record: CycleRecord, token_ids: Sequence[int], text: str) -> ModeDecision:
        self.judged += 1
        return ModeDecision("spec", 8)

    def finish(self, stats: Any) -> None:
        pass


def test_batched_rows_are_counted_but_not_judged() -> None:
    recorder = Recorder()
    request = GenerationRequest((1, 2, 3), 64, mode="spec", mode_plan={REJECTIONS_TO_SHRINK: "ar"})
    control = ModeControl(
        request, recorder, spec_block=8, lookup_block=8, drafter=True, draft_length="adaptive"
    )
    rejected = CycleRecord(0, "spec", 8, 7, 0, 1, 0.0, 0.0, 0.0, 10)
    for _ in range(REJECTIONS_TO_SHRINK):
        assert control.next_step(64) == ("spec", 8)
        control.after_step(rejected, [1], "", judged=False)
    assert recorder.judged == 0
    # The draft length saw the rejections (halved), the plan its step count (switched).
    assert control.next_step(64) == ("ar", 4)
    control.after_step(replace(rejected, mode="ar", drafted=0), [1], "")
    assert recorder.judged == 1
