"""A scripted decoding world: per span kind, how many draft tokens a cycle accepts, and what a
cycle or AR step costs. Drives a controller over a script of output text, one char per token."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from toolflash.engine.api import GenerationStats, ModeController
from toolflash.policy.spans import SpanTracker

from .fakes import ar_record, lookup_record, spec_record


@dataclass
class World:
    accepted: dict[str, int]  # span kind -> draft tokens a cycle accepts
    cycle_s: dict[int, float]  # block size -> seconds per spec cycle
    ar_s: float
    # span kind -> tokens a lookup step commits (1: no match, an AR step), and its seconds
    lookup_tokens: dict[str, int] = field(default_factory=dict)
    lookup_s: float = 0.0
    noise: float = 0.0
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def jitter(self, seconds: float) -> float:
        return seconds * (1.0 + self.rng.uniform(-self.noise, self.noise))


def span_at(script: str) -> list[str]:
    """The span kind in force when each char of the script is generated (what the text before
    it says: the last char of a closing marker still belongs to the span it closes)."""
    tracker = SpanTracker()
    kinds = [tracker.kind]
    kinds.extend(tracker.push(c) for c in script[:-1])
    return kinds


@dataclass
class Trace:
    steps: list[tuple[str, str, int]]  # (true span, mode, block size)
    seconds: float
    tokens: int


def drive(
    controller: ModeController,
    world: World,
    script: str,
    prompt: int = 300,
    block: int = 8,
    lookup_block: int = 0,
) -> Trace:
    """`block`: the drafter's block (0: no drafter); `lookup_block`: lookup's (0: none)."""
    truth = span_at(script)
    decision = controller.start(prompt, block, lookup_block)
    pos, i, seconds = 0, 0, 0.0
    steps: list[tuple[str, str, int]] = []
    records = []
    while pos < len(script):
        span = truth[pos]
        if decision.mode == "spec":
            block = decision.block_size
            acc = min(world.accepted[span], block - 1, len(script) - pos - 1)
            record = spec_record(i, block, acc, world.jitter(world.cycle_s[block]), prompt + pos)
        elif decision.mode == "lookup":
            n = min(world.lookup_tokens[span], decision.block_size, len(script) - pos)
            record = lookup_record(i, n, world.jitter(world.lookup_s), prompt + pos)
        else:
            record = ar_record(i, world.jitter(world.ar_s), prompt + pos)
        steps.append((span, record.mode, record.block_size))
        text = script[pos : pos + record.committed]
        pos += record.committed
        i += 1
        seconds += record.total_s
        records.append(record)
        decision = controller.after_step(record, [0] * record.committed, text)
    controller.finish(GenerationStats(prompt, 0, len(script), 0.0, seconds, tuple(records)))
    return Trace(steps, seconds, len(script))
