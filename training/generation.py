"""Greedy generation with toolflash's own session: target-only (AR) for distillation data, or
speculative (the real draft-verify loop) for evaluation."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from toolflash.engine.api import CycleRecord, Mode
from toolflash.engine.draft_context import DraftWindow
from toolflash.engine.drafter import DFlashDrafter
from toolflash.engine.lookup import LookupConfig
from toolflash.engine.session import GenerationSession
from toolflash.engine.stops import StopMatcher
from toolflash.engine.targets.base import TargetAdapter


@dataclass(frozen=True)
class Generation:
    """One greedy generation: the output tokens (stop token included), its cycles and the
    decode time (prefill excluded)."""

    output: list[int]
    cycles: list[CycleRecord]
    prefill_s: float
    decode_s: float
    finish: str  # "stop" or "length"


def generate(
    target: TargetAdapter,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_ids: Iterable[int],
    drafter: DFlashDrafter | None = None,
    mode: Mode = "ar",
    block_size: int = 1,
    window: DraftWindow | None = None,
) -> Generation:
    """Greedy decode `prompt` until a stop id or `max_new_tokens`. In `spec` mode every
    cycle drafts with `drafter` and verifies with the target (lossless at temperature 0); no
    cycle copies a lookup continuation instead, so the acceptance measured is the drafter's."""
    matcher = StopMatcher(frozenset(stop_ids), (), max_new_tokens, lambda _: "")
    # window=None on DraftWindow keeps the whole context, as training does.
    session = GenerationSession(
        target,
        drafter,
        window=window or DraftWindow(window=None),
        lookup=LookupConfig(spec_takeover=False),
    )
    t0 = time.perf_counter()
    first = session.prefill(list(prompt))
    t1 = time.perf_counter()
    cycles: list[CycleRecord] = []
    finished = matcher.check([first]) is not None
    while not finished:
        step = session.step(mode, block_size, matcher.check)
        cycles.append(step.record)
        finished = step.finished
    t2 = time.perf_counter()
    output = session.tokens[len(prompt) :]
    return Generation(output, cycles, t1 - t0, t2 - t1, matcher.reason or "length")
