"""The decision record: what a mode controller decided, at which step, in which span, and why.

One frozen `DecisionRecord` per decision. The adaptive controller makes them (with the kind of
decision and the surplus it read) and keeps them (`DecisionRecords`) as `records`; the response's
`toolflash.decisions`, the `policy.decision` log line, the `decisions` counter and the
controller's summary are all rendered from them. A controller that keeps no records (a scripted
one) is wrapped by `recording`, which records each change of mode or block it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from toolflash.engine.api import CycleRecord, GenerationStats, ModeController, ModeDecision

from .throughput import Surplus


@dataclass(frozen=True)
class DecisionRecord:
    """From decode step `step` on (`tokens` committed before it), run `mode` (spec or lookup at
    `block_size`, None for AR) in span kind `span`, because `reason`. `kind` names the
    decision (`start`, `span`, `recheck`, `probe`, ... see gateway/SERVER.md); `surplus` is what
    the estimates said of spec vs AR there when it was made (None from a scripted controller)."""

    step: int
    mode: str
    block_size: int | None
    reason: str
    span: str | None = None
    kind: str | None = None
    tokens: int = 0
    surplus: Surplus | None = None

    @property
    def arm_name(self) -> str:
        return "ar" if self.mode == "ar" else f"{self.mode}{self.block_size}"

    def entry(self) -> dict[str, Any]:
        """The controller summary's dict (the surplus's fields included; its `block_size` is
        the block the surplus was read at)."""
        out: dict[str, Any] = {
            "step": self.step,
            "tokens": self.tokens,
            "span": self.span,
            "mode": self.mode,
            "block_size": self.block_size,
            "kind": self.kind,
            "reason": self.reason,
        }
        if self.surplus is not None:
            out.update(self.surplus.as_dict())
        return out


class DecisionRecords:
    """A controller's decision records: listed up to `max_recorded` (the rest counted as
    `dropped`), and handed to `publish` (its log line and counter) in order, in batches of
    `batch`, or when `flush` is called: at finish, off the decode steps."""

    def __init__(
        self, max_recorded: int, publish: Callable[[DecisionRecord], None], batch: int = 32
    ) -> None:
        self.records: list[DecisionRecord] = []
        self.dropped = 0
        self.max_recorded = max_recorded
        self.batch = batch
        self._publish = publish
        self._queued: list[DecisionRecord] = []

    def add(self, record: DecisionRecord) -> None:
        if len(self.records) < self.max_recorded:
            self.records.append(record)
        else:
            self.dropped += 1
        self._queued.append(record)
        if len(self._queued) >= self.batch:
            self.flush()

    def flush(self) -> None:
        queued, self._queued = self._queued, []
        for record in queued:
            self._publish(record)


@runtime_checkable
class RecordsDecisions(Protocol):
    """A mode controller that keeps its own decision records."""

    @property
    def records(self) -> Sequence[DecisionRecord]: ...


class RecordingController:
    """A `ModeController` that delegates to one that keeps no records, and records each decision
    that changed the mode or block (written on the engine thread, read after the FinishEvent)."""

    def __init__(self, inner: ModeController) -> None:
        self.inner = inner
        self.records: list[DecisionRecord] = []

    def prepare(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> None:
        self.inner.prepare(prompt_tokens, default_block_size, lookup_block)

    def observe_prefix(self, text: str) -> None:
        self.inner.observe_prefix(text)

    def start(
        self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0
    ) -> ModeDecision:
        decision = self.inner.start(prompt_tokens, default_block_size, lookup_block)
        self._note(0, decision)
        return decision

    def after_step(self, record: CycleRecord, token_ids: Sequence[int], text: str) -> ModeDecision:
        decision = self.inner.after_step(record, token_ids, text)
        self._note(record.index + 1, decision)
        return decision

    def finish(self, stats: GenerationStats) -> None:
        self.inner.finish(stats)

    def _note(self, step: int, d: ModeDecision) -> None:
        block = d.block_size if d.mode != "ar" else None
        last = self.records[-1] if self.records else None
        if last is None or (last.mode, last.block_size) != (d.mode, block):
            self.records.append(DecisionRecord(step, d.mode, block, d.reason))


class RecordedController(ModeController, RecordsDecisions, Protocol):
    """A mode controller with its decision records (what the gateway serves)."""


def recording(controller: ModeController) -> RecordedController:
    """`controller` itself when it keeps decision records, else wrapped to keep them."""
    if isinstance(controller, RecordsDecisions):
        return controller
    return RecordingController(controller)
