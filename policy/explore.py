"""Bounded, cheap exploration: when to try the other mode (or block size) for a few steps.

A probe runs only where the estimate is uncertain: the alternative has fewer than `min_samples`
effective samples, or the confidence that it beats the current choice lies between `explore_p`
and the confidence needed to switch outright. Probes are short, each request has a budget of
probe steps, and a probe that loses pushes the next probe of the same arm back exponentially
(in steps of that model/class/span), up to a cap. dflash-mlx instead re-probes block 16 every 64
reduced cycles forever, which loses every time on machines where it never pays
(anchor-dflash-mlx.md 3.3); here consecutive losses wait `base`, `2 * base`, `4 * base`...
steps, so an arm that never pays costs a logarithmic number of probes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .estimates import Throughput, normal_cdf

Arm = tuple[str, int]  # ("ar", 1) or ("spec", block_size)
Scope = tuple[str, str, str]  # model, class label, span kind


def arm_name(arm: Arm) -> str:
    return "ar" if arm[0] == "ar" else f"spec{arm[1]}"


def p_better(alt: Throughput, cur: Throughput) -> float:
    """Confidence that `alt` is faster than `cur` (0.5 when either is unknown)."""
    if not (alt.known and cur.known):
        return 0.5
    std = math.sqrt(alt.std**2 + cur.std**2)
    if not math.isfinite(std):
        return 0.5
    if std <= 0:
        return 1.0 if alt.tps > cur.tps else 0.0
    return normal_cdf((alt.tps - cur.tps) / std)


def probe_reason(
    alt: Throughput, cur: Throughput, *, min_samples: float, explore_p: float, min_confidence: float
) -> str | None:
    """Why `alt` deserves a probe against `cur`, or None when the estimates already decide."""
    if alt.samples < min_samples:
        return "few-samples"
    p = p_better(alt, cur)
    if explore_p <= p < min_confidence:
        return "uncertain"
    return None


@dataclass
class _ArmBackoff:
    losses: int = 0
    next_step: int = 0


class Backoff:
    """Process-wide probe backoff per (model, class, span, arm), counted in steps of the scope."""

    def __init__(self, base_steps: int = 32, max_steps: int = 8192) -> None:
        self.base_steps = base_steps
        self.max_steps = max_steps
        self._steps: dict[Scope, int] = {}
        self._arms: dict[tuple[Scope, Arm], _ArmBackoff] = {}

    def tick(self, scope: Scope, steps: int = 1) -> None:
        self._steps[scope] = self._steps.get(scope, 0) + steps

    def steps(self, scope: Scope) -> int:
        return self._steps.get(scope, 0)

    def allowed(self, scope: Scope, arm: Arm) -> bool:
        state = self._arms.get((scope, arm))
        return state is None or self.steps(scope) >= state.next_step

    def losses(self, scope: Scope, arm: Arm) -> int:
        state = self._arms.get((scope, arm))
        return state.losses if state else 0

    def lost(self, scope: Scope, arm: Arm) -> int:
        """Record a losing probe; returns the steps until the arm may be probed again."""
        state = self._arms.setdefault((scope, arm), _ArmBackoff())
        wait = min(self.base_steps * 2**state.losses, self.max_steps)
        state.losses += 1
        state.next_step = self.steps(scope) + wait
        return wait

    def won(self, scope: Scope, arm: Arm) -> None:
        self._arms.pop((scope, arm), None)


@dataclass
class Probe:
    """A probe in flight: run `arm` for `remaining` more steps, then compare with `base`."""

    arm: Arm
    base: Arm
    remaining: int
    reason: str
