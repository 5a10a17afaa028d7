"""One exponentially decayed mean with variance (`Stat`), and the helpers the estimates build on:
context buckets and the normal CDF."""

from __future__ import annotations

import math
from collections.abc import Iterable


def context_bucket(context_len: int, smallest: int = 256) -> int:
    """The power of two at or above `context_len` (at least `smallest`): comparable contexts."""
    n = max(int(context_len), 1)
    return max(smallest, 1 << (n - 1).bit_length())


def normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


class Stat:
    """Exponentially decayed mean and variance of one quantity."""

    __slots__ = ("weight", "s1", "s2", "count", "updated")

    def __init__(
        self,
        weight: float = 0.0,
        s1: float = 0.0,
        s2: float = 0.0,
        count: int = 0,
        updated: float = 0.0,
    ) -> None:
        self.weight = weight
        self.s1 = s1
        self.s2 = s2
        self.count = count  # raw samples ever seen (not decayed)
        self.updated = updated

    def add(self, x: float, now: float, sample_decay: float, half_life_s: float) -> None:
        d = sample_decay * _time_decay(now - self.updated, half_life_s) if self.count else 0.0
        self.weight = self.weight * d + 1.0
        self.s1 = self.s1 * d + x
        self.s2 = self.s2 * d + x * x
        self.count += 1
        self.updated = now

    def effective(self, now: float, half_life_s: float) -> float:
        """Decayed weight as of `now` (the effective number of samples)."""
        return self.weight * _time_decay(now - self.updated, half_life_s)

    @property
    def mean(self) -> float:
        return self.s1 / self.weight if self.weight > 0 else 0.0

    @property
    def var(self) -> float:
        if self.weight <= 0:
            return 0.0
        m = self.s1 / self.weight
        return max(self.s2 / self.weight - m * m, 0.0)

    def to_list(self) -> list[float]:
        return [self.weight, self.s1, self.s2, float(self.count), self.updated]

    @classmethod
    def from_list(cls, values: Iterable[float]) -> Stat:
        w, s1, s2, n, t = (float(v) for v in values)
        if not (w >= 0 and n >= 0 and all(math.isfinite(v) for v in (w, s1, s2, n, t))):
            raise ValueError("bad stat")
        return cls(w, s1, s2, int(n), t)


def _time_decay(age_s: float, half_life_s: float) -> float:
    if half_life_s <= 0 or age_s <= 0:
        return 1.0
    return 0.5 ** (age_s / half_life_s)
