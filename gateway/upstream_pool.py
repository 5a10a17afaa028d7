"""A pool's replicas and the routing decisions over them, as pure functions of their state:
least-loaded choice, circuit breaking after repeated failures, health."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from toolflash.gateway.upstream_config import UpstreamPool


@dataclass
class Replica:
    """One upstream server of a pool and what the gateway knows of it (event loop only)."""

    url: str
    in_flight: int = 0
    failures: int = 0  # consecutive: reset by a success
    open_until: float = 0.0  # circuit open (skipped) until this monotonic time
    healthy: bool = True  # the last health check's answer (optimistic before the first)
    requests: int = 0
    errors: int = 0

    def available(self, now: float, capacity: int) -> bool:
        return self.healthy and now >= self.open_until and self.in_flight < capacity


def pick(replicas: Iterable[Replica], now: float, capacity: int, tried: set[str]) -> Replica | None:
    """The least-loaded available replica not tried yet for this request (fewest in flight,
    then fewest recent failures, then the pool's order); None when none is. When no replica
    passed its last health check, the others are tried anyway (a check may be stale: a server
    still loading at the last one); open circuits and full replicas are never tried."""
    left = [r for r in replicas if r.url not in tried]
    healthy = [r for r in left if r.available(now, capacity)]
    if not healthy and not any(r.healthy for r in left):
        healthy = [r for r in left if now >= r.open_until and r.in_flight < capacity]
    return min(healthy, key=lambda r: (r.in_flight, r.failures), default=None)


def failed(replica: Replica, now: float, pool: UpstreamPool) -> None:
    """A failure (connect, status, timeout, broken stream): `failures_to_open` in a row open
    the circuit for `cooldown_s`."""
    replica.failures += 1
    replica.errors += 1
    if replica.failures >= pool.failures_to_open:
        replica.open_until = now + pool.cooldown_s
        replica.failures = 0


def succeeded(replica: Replica) -> None:
    replica.failures = 0


def health_url(base_url: str, path: str) -> str:
    """The health check URL on a replica's host (a base URL usually ends in /v1)."""
    scheme, _, rest = base_url.partition("://")
    host = rest.split("/", 1)[0]
    return f"{scheme}://{host}{path}"
