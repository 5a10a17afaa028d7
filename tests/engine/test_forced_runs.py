"""Forced runs (tokens a constraint offers instead of drafting) are only proposals: sampled
decoding stays exact when the target may refuse them (a grammar whose forced bytes have other
tokenizations leaves p not one-hot), and greedy output stays identical to AR."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from toolflash.engine.api import ConstraintStats, SamplingParams
from toolflash.engine.choosers import GreedyChooser, SamplingChooser
from toolflash.engine.session import GenerationSession

from .stats import ALPHA, chi_square
from .test_sampling_session import BLOCK, PROMPT, V, exact, never, pair  # noqa: F401

SUGGESTED = 5


class Suggests:
    """A processor that offers `token` as a forced run of one at every position but allows
    every token: the target decides, so the output must follow its distribution exactly."""

    def __init__(self, token: int) -> None:
        self.token = token

    def process(self, logits: mx.array, draft: Sequence[int]) -> tuple[mx.array, int]:
        return logits, len(draft)

    def commit(self, tokens: Sequence[int]) -> None:
        return None

    def forced(self, limit: int) -> list[int]:
        return [self.token][:limit]

    def stats(self) -> ConstraintStats | None:
        return None


def test_sampling_with_a_refusable_forced_run_is_exact(pair: Any) -> None:  # noqa: F811
    """Each cycle proposes the suggested token alone (one-hot q, no drafter run); the first
    two output tokens after a fixed greedy t0 must follow the target's joint distribution."""
    model, target, drafter = pair
    base = GenerationSession(target, drafter)
    t0 = base.prefill(PROMPT)
    state = base.export_state()
    n = 2000
    out = np.zeros((n, 2), dtype=np.int64)
    cycles = forced = 0
    for i in range(n):
        s = GenerationSession(target, drafter)
        s.prefill(PROMPT, restore=state)  # commits the same greedy t0
        chooser = SamplingChooser(SamplingParams(temperature=1.0, seed=i), [Suggests(SUGGESTED)])
        s.chooser = chooser
        chooser.commit([t0])
        got: list[int] = []
        while len(got) < 2:
            step = s.step("spec", BLOCK, never)
            cycles += 1
            forced += step.record.drafted == 1
            got += step.tokens
        out[i] = got[:2]
    assert forced == cycles >= n  # every cycle verified the suggestion alone
    p1, joint = exact(model, t0, {"temperature": 1.0})
    assert 0.02 < p1[SUGGESTED] < 0.98, "the test needs a suggestion the target may refuse"
    p_first, _ = chi_square(np.bincount(out[:, 0], minlength=V), p1)
    p_two, _ = chi_square(np.bincount(out[:, 0] * V + out[:, 1], minlength=V * V), joint)
    assert p_first > ALPHA and p_two > ALPHA, (p_first, p_two)


def test_greedy_with_forced_suggestions_equals_ar(pair: Any) -> None:  # noqa: F811
    _, target, drafter = pair

    def run(mode: str) -> list[int]:
        chooser = GreedyChooser([Suggests(SUGGESTED)])
        s = GenerationSession(target, drafter, chooser=chooser)
        out = [s.prefill(PROMPT)]
        while len(out) < 24:
            out += s.step(mode, BLOCK, never).tokens  # type: ignore[arg-type]
        return out[:24]

    assert run("spec") == run("ar")
