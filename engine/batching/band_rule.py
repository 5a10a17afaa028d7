"""Whether a batch whose rows all want speculation runs a batched verify or a batched AR step,
learnt per batch-size band from the steps the batch has run.

A batched verify computes rows x block positions to commit each row's accepted prefix; a
batched AR step computes one position per row. Which commits more tokens per second depends on
the device (a GPU verifies many rows nearly for free, a CPU pays for every position), the
drafter's acceptance on the running requests and the rows' context lengths, so no constant
fits: on the 2-core CPU, verify won at 2 rows and lost at 4 and 8 (`benchmarks/batch_step.py
--mode spec`). The scheduler records each batched step's committed tokens and wall time under
its band and kind; `choose` runs the kind with the higher measured rate, each kind first tried
`MIN_STEPS` times, and the losing kind again every `PROBE_EVERY` steps of a band (acceptance and
context lengths drift)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..api import batch_band

BatchKind = Literal["batched_spec", "batched_ar"]
KINDS: tuple[BatchKind, ...] = ("batched_spec", "batched_ar")

MIN_STEPS = 3  # steps of each kind a band measures before it trusts the rates
# A band's steps between two tries of the kind it is not choosing: a probe of the slower kind
# costs at most a few steps' time (an 8-row verify took ~8 AR steps on the 2-core CPU), so
# probes take ~2% of a band's time at worst.
PROBE_EVERY = 256
DECAY = 0.9  # weight of the history against each new step (rates follow drift)


@dataclass
class Rate:
    """Committed tokens and seconds of one kind of step in one band, exponentially weighted."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.tokens * DECAY + tokens
        self.seconds = self.seconds * DECAY + seconds
        self.steps += 1

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def pick(spec: Rate, ar: Rate, band_steps: int) -> BatchKind:
    """The kind to run next in a band: each kind until measured `MIN_STEPS` times (verify
    first), then the faster, except one probe of the slower every `PROBE_EVERY` band steps."""
    for kind, rate in zip(KINDS, (spec, ar)):
        if rate.steps < MIN_STEPS:
            return kind
    faster: BatchKind = "batched_spec" if spec.tokens_per_s >= ar.tokens_per_s else "batched_ar"
    if band_steps % PROBE_EVERY == PROBE_EVERY - 1:
        return "batched_ar" if faster == "batched_spec" else "batched_spec"
    return faster


@dataclass
class BandRule:
    """The per-band rates of one scheduler."""

    rates: dict[tuple[str, BatchKind], Rate] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)

    def _rate(self, band: str, kind: BatchKind) -> Rate:
        return self.rates.setdefault((band, kind), Rate())

    def choose(self, rows: int) -> BatchKind:
        """The kind of the next batched step over `rows` rows that all want speculation."""
        band = batch_band(rows)
        spec, ar = self._rate(band, "batched_spec"), self._rate(band, "batched_ar")
        kind = pick(spec, ar, self.steps.get(band, 0))
        self.steps[band] = self.steps.get(band, 0) + 1
        return kind

    def record(self, rows: int, kind: BatchKind, tokens: int, seconds: float) -> None:
        """A batched step of `kind` over `rows` rows committed `tokens` in `seconds`."""
        self._rate(batch_band(rows), kind).add(tokens, seconds)

    def summary(self) -> dict[str, dict[str, float]]:
        """Measured tokens/s per band and kind (for logs and benchmarks)."""
        out: dict[str, dict[str, float]] = {}
        for (band, kind), rate in sorted(self.rates.items()):
            if rate.steps:
                out.setdefault(band, {})[kind] = round(rate.tokens_per_s, 1)
        return out
