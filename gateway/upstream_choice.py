"""Which pool serves a request when several pools serve one model: what the gateway learned of
each pool's decode speed per request class, and the pure decision over it.

The request class is the local policy's (`policy/request_class.py`, through
`gateway.prepare.request_class`): a pool that decodes tool-call turns fastest gets them, even
where another pool is faster on long chat answers. Speeds come from the responses the gateway
proxies (the upstream's completion tokens over the time from its first chunk to its last), so
they include what a client sees of the pool: its hardware, its engine, its load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

RouteMode = Literal["surplus", "least_loaded"]

# Weight of a new measurement in a pool's running speed: recent enough to follow a pool whose
# load changes, smooth enough that one slow request does not move a class to another pool.
SPEED_WEIGHT = 0.25


@dataclass(frozen=True)
class Speed:
    """A pool's decode speed on one request class: a running mean and how many requests it
    has seen."""

    tokens_per_s: float
    samples: int

    def add(self, tokens_per_s: float) -> Speed:
        if self.samples == 0:
            return Speed(tokens_per_s, 1)
        mean = self.tokens_per_s + SPEED_WEIGHT * (tokens_per_s - self.tokens_per_s)
        return Speed(mean, self.samples + 1)


NO_SPEED = Speed(0.0, 0)


def decode_speed(completion_tokens: int, decode_s: float) -> float | None:
    """Tokens per second after the first chunk (None: too short to say: fewer than two tokens,
    or no time between the first chunk and the last)."""
    if completion_tokens < 2 or decode_s <= 0:
        return None
    return (completion_tokens - 1) / decode_s


@dataclass(frozen=True)
class PoolState:
    """What the decision reads of one pool: its name, its load (requests in flight over the
    slots of its replicas that can take one now; None when none can) and its speed on the
    request's class."""

    name: str
    load: float | None
    speed: Speed = NO_SPEED


@dataclass(frozen=True)
class Choice:
    """Pools in the order to try them (the first that has a replica free takes the request),
    and why the first comes first."""

    order: tuple[str, ...]
    reason: str


def choose(
    pools: Sequence[PoolState],
    mode: RouteMode,
    label: str,
    draw: float,
    explore_p: float,
    min_samples: int,
) -> Choice:
    """The order to try a model's pools in, for one request of class `label`.

    Pools that cannot take a request now (`load` None) come last, in the file's order. With
    `least_loaded` the others go by load (ties: the file's order). With `surplus`: a pool
    with fewer than `min_samples` measured requests of this class comes first (fewest first:
    every pool gets measured); then the fastest on this class, unless `draw` (uniform in
    [0, 1)) falls under `explore_p`, which puts one of the slower measured pools first, chosen
    by the same draw (a pool that got faster, or less loaded, is measured again)."""
    ready = [p for p in pools if p.load is not None]
    rest = tuple(p.name for p in pools if p.load is None)
    if not ready:
        return Choice(rest, "no pool has a replica free")
    by_load = sorted(ready, key=lambda p: p.load or 0.0)  # stable: the file's order on ties
    if mode == "least_loaded" or len(ready) == 1:
        first = by_load[0]
        why = "the only one with a replica free" if len(ready) == 1 else "least loaded"
        return Choice(
            tuple(p.name for p in by_load) + rest, f"pool {first.name}: {why} ({first.load:.2f})"
        )
    unmeasured = sorted(
        (p for p in by_load if p.speed.samples < min_samples), key=lambda p: p.speed.samples
    )
    measured = sorted(
        (p for p in ready if p.speed.samples >= min_samples),
        key=lambda p: -p.speed.tokens_per_s,
    )
    if unmeasured:
        first = unmeasured[0]
        reason = (
            f"pool {first.name}: {first.speed.samples} of {min_samples} measurements on {label}"
        )
    elif draw < explore_p:
        slower = measured[1:]
        first = slower[min(int(draw / explore_p * len(slower)), len(slower) - 1)]
        reason = (
            f"pool {first.name}: exploring ({first.speed.tokens_per_s:.1f} tok/s on {label},"
            f" best {measured[0].name} {measured[0].speed.tokens_per_s:.1f})"
        )
    else:
        first = measured[0]
        nxt = measured[1]
        surplus = first.speed.tokens_per_s / nxt.speed.tokens_per_s - 1
        reason = (
            f"pool {first.name}: fastest on {label} ({first.speed.tokens_per_s:.1f} tok/s,"
            f" {surplus:+.0%} over {nxt.name})"
        )
    order = [first, *(p for p in [*unmeasured, *measured] if p is not first)]
    return Choice(tuple(p.name for p in order) + rest, reason)


class SpeedTable:
    """Every (pool, class) speed the gateway measured (event loop only; in memory: a restart
    measures again)."""

    def __init__(self) -> None:
        self._speeds: dict[tuple[str, str], Speed] = {}

    def get(self, pool: str, label: str) -> Speed:
        return self._speeds.get((pool, label), NO_SPEED)

    def add(self, pool: str, label: str, tokens_per_s: float) -> None:
        self._speeds[(pool, label)] = self.get(pool, label).add(tokens_per_s)

    def items(self) -> Mapping[tuple[str, str], Speed]:
        return dict(self._speeds)
