"""This request's own acceptance, next to the class's.

The class estimates average over requests, but acceptance varies between requests of one class:
after a tool result, a reply that copies from the tool output accepts ~10 tokens per cycle where
one that writes new prose accepts ~1. With the class mean below break-even, every request ran
AR, also the ones where speculation would have halved the decode time. So a request keeps a
tally of its own drafted cycles per span kind, and the controller uses it two ways:

- Opening probe: where the class decides AR, the first step of the request, and of each span
  kind it enters, is one spec cycle (at the largest block); the span stays speculative when
  that cycle committed enough to beat AR, and its own recent cycles, not the class's, then
  decide at rechecks. Those cycles do not feed the class's estimates: they ran because this
  request won, and the class learning from its winners alone would send its losers to spec.
  Losing openings back off per class and span, in chances to open (`trial.opening_backoff`);
  after a lost one, no spec probes in that span for the rest of the request.
- Request rechecks: once a span has `min_cycles` drafted cycles of its own, its tokens per cycle
  over the last `WINDOW` of them (not the class's) decide between spec and AR at rechecks; the
  window keeps a collapse of acceptance late in a long span from hiding behind its good start.

Both compare `tau / cycle seconds` (the class's measured cycle time at this block and context:
one cycle's own time is too noisy, the first one also pays the drafter's context build) with
the class's AR tokens per second, by the rule's switch margin (`decide.local_verdict`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from toolflash.engine.api import CycleRecord

# Drafted cycles per span that a request's own tokens per cycle averages over.
WINDOW = 8


@dataclass
class RequestEvidence:
    """Drafted spec cycles of one request, per span kind. A span where this request met a
    grammar-forced run has no evidence of its own: forced runs add throughput to the spec arm
    that drafted cycles alone do not show, which the class estimates mix in at their measured
    share (`Estimates.with_forced`) and a short tally cannot."""

    min_cycles: int
    _spans: dict[str, deque[int]] = field(default_factory=dict)
    _forced: set[str] = field(default_factory=set)

    def add(self, span: str, record: CycleRecord) -> None:
        if record.forced > 0:
            self._forced.add(span)
        elif record.mode == "spec" and record.drafted > 0:
            self._spans.setdefault(span, deque(maxlen=WINDOW)).append(record.committed)

    def cycles(self, span: str) -> int:
        """Drafted cycles in the window for `span`."""
        return len(self._spans.get(span, ()))

    def tau(self, span: str, min_cycles: int | None = None) -> float | None:
        """Committed tokens per drafted cycle over the window, once it holds enough cycles
        (`min_cycles` 0 turns the evidence off, except where a caller asks for fewer)."""
        recent = self._spans.get(span)
        need = self.min_cycles if min_cycles is None else min_cycles
        if need <= 0 or recent is None or len(recent) < need or span in self._forced:
            return None
        return sum(recent) / len(recent)
