"""Seeded random keys for sampled decoding.

Every draw takes a key derived from (seed, purpose, output position) by a fixed integer hash,
not from a stateful generator: a seeded request replays the same keys whatever happened
before (a retry, another request in between), so its output is reproducible in AR mode and in
speculative mode, each on its own. The two modes consume randomness differently (a cycle
draws a whole block at once), so the same seed gives different, equally distributed, outputs
across modes.
"""

from __future__ import annotations

import secrets

import mlx.core as mx

_MASK = (1 << 64) - 1

# What a key is for: independent streams for the AR draw, the drafter's proposal, the
# acceptance uniforms and the residual/bonus draw of a speculative cycle.
CHOOSE, DRAFT, ACCEPT, RESAMPLE = 1, 2, 3, 4


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class KeySchedule:
    """Keys for one request. `seed=None` draws a fresh seed (unreproducible, as OpenAI's)."""

    def __init__(self, seed: int | None):
        self.seed = (seed if seed is not None else secrets.randbits(63)) & _MASK

    def key(self, purpose: int, position: int) -> mx.array:
        """The key for `purpose` at output position `position` (tokens committed so far)."""
        mixed = _splitmix64(_splitmix64(_splitmix64(self.seed) ^ purpose) ^ position)
        return mx.random.key(mixed)
