"""What an estimate reads as: a throughput with its standard error and own samples, and the
speculative surplus (spec minus AR) built from two of them. `Estimates` learns; the decisions
(`decide`, `controller`, `reads`) read these."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .stat import normal_cdf


@dataclass(frozen=True)
class Throughput:
    """An estimated throughput (tokens/s) with its standard error and the effective samples
    measured for exactly this case (0 when the estimate is only a prior borrowed from a pool)."""

    tps: float
    std: float
    samples: float
    # Where a prior (0 own samples) comes from: "class" (this class and span, calibrated or
    # measured at a smaller block), "pool" (other classes or spans); "" for own measurements.
    prior: str = ""

    @property
    def known(self) -> bool:
        return self.tps > 0 and math.isfinite(self.std)


UNKNOWN = Throughput(0.0, math.inf, 0.0)


@dataclass(frozen=True)
class Surplus:
    """Spec minus AR throughput at one context length, for one (model, class, span, block)."""

    spec: Throughput
    ar: Throughput
    tau: float
    block_size: int

    @property
    def value(self) -> float:
        return self.spec.tps - self.ar.tps

    @property
    def std(self) -> float:
        return math.sqrt(self.spec.std**2 + self.ar.std**2)

    @property
    def p_positive(self) -> float:
        """Confidence that speculative decoding is faster here (0.5 when unknown)."""
        if not (self.spec.known and self.ar.known):
            return 0.5
        if self.std <= 0:
            return 1.0 if self.value > 0 else 0.0
        return normal_cdf(self.value / self.std)

    @property
    def samples(self) -> float:
        return min(self.spec.samples, self.ar.samples)

    def as_dict(self) -> dict[str, float | int]:
        return {
            "spec_tps": round(self.spec.tps, 2),
            "ar_tps": round(self.ar.tps, 2),
            "surplus": round(self.value, 2),
            "surplus_std": round(self.std, 2) if math.isfinite(self.std) else -1.0,
            "p_spec_faster": round(self.p_positive, 3),
            "tau": round(self.tau, 2),
            "block_size": self.block_size,
            "samples": round(self.samples, 1),
        }
