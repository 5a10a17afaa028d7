"""Record what a mode controller decided, for the response's `toolflash.decisions` list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from toolflash.engine.api import CycleRecord, GenerationStats, ModeController, ModeDecision


@dataclass(frozen=True)
class LoggedDecision:
    """From cycle `cycle` on, decode in `mode` with `block_size`, because `reason`."""

    cycle: int
    mode: str
    block_size: int | None
    reason: str


class DecisionLog:
    """A `ModeController` that delegates to another and keeps the decisions that changed
    something (written on the engine thread, read after the FinishEvent)."""

    def __init__(self, inner: ModeController) -> None:
        self.inner = inner
        self.decisions: list[LoggedDecision] = []

    def prepare(self, prompt_tokens: int, default_block_size: int) -> None:
        self.inner.prepare(prompt_tokens, default_block_size)

    def observe_prefix(self, text: str) -> None:
        self.inner.observe_prefix(text)

    def start(self, prompt_tokens: int, default_block_size: int) -> ModeDecision:
        decision = self.inner.start(prompt_tokens, default_block_size)
        self._note(0, decision)
        return decision

    def after_step(self, record: CycleRecord, token_ids: Sequence[int], text: str) -> ModeDecision:
        decision = self.inner.after_step(record, token_ids, text)
        self._note(record.index + 1, decision)
        return decision

    def finish(self, stats: GenerationStats) -> None:
        self.inner.finish(stats)

    def _note(self, cycle: int, d: ModeDecision) -> None:
        block = d.block_size if d.mode == "spec" else None
        last = self.decisions[-1] if self.decisions else None
        if last is None or (last.mode, last.block_size) != (d.mode, block):
            self.decisions.append(LoggedDecision(cycle, d.mode, block, d.reason))
