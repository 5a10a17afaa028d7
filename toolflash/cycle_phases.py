"""Where a speculative cycle's time goes: the drafter's forward, the verify forward, and the
rest (host work, synchronisation, the engine loop between cycles).

A cycle has one host synchronisation, so its two forwards cannot be timed apart inside it
without changing what runs. Instead each forward is timed alone here, at the cycle's shapes
(the same block, the same context), and compared with the cycles' measured wall time: what
the two forwards do not account for is overhead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from toolflash.engine.session import GenerationSession, dflash_proposal


def _median_s(fn: Callable[[], None], runs: int) -> float:
    for _ in range(3):  # warm-up: first-shape compilation, allocator
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def forward_costs(
    engine: Any, context: Sequence[int], block_size: int, runs: int = 20
) -> dict[str, float]:
    """Median seconds of the drafter's forward (one block) and of the target's verify forward
    (a block of `block_size` rows, rolled back after each) after `context`."""
    session = GenerationSession(engine.target, engine.drafter, window=engine.options.window)
    session.prefill(list(context))

    def draft() -> None:
        mx.eval(dflash_proposal(session, block_size))

    def verify() -> None:
        block = mx.array([[session.staged] * block_size])
        res = engine.target.forward(block, session.cache, session.capture, keep_tape=True)
        mx.eval(res.logits, *([res.features] if res.features is not None else []))
        engine.target.rollback(session.cache, res, 0)

    return {"draft_s": _median_s(draft, runs), "verify_s": _median_s(verify, runs)}


def phase_split(cycle_s: float, costs: dict[str, float]) -> dict[str, float]:
    """Shares of a cycle of `cycle_s` wall seconds: draft, verify and the overhead left."""
    if cycle_s <= 0:
        return {"draft": 0.0, "verify": 0.0, "overhead": 0.0}
    draft = costs["draft_s"] / cycle_s
    verify = costs["verify_s"] / cycle_s
    return {
        "draft": round(draft, 4),
        "verify": round(verify, 4),
        "overhead": round(1.0 - draft - verify, 4),
    }
