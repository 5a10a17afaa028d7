"""The prefix cache the engine uses: L1 in memory, optional L2 on disk, one lookup and one
publish, with counters for /metrics."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from toolflash.cache.state import SessionState

from .config import CacheConfig
from .key import SnapshotKey
from .l1 import MemoryCache
from .l2 import DiskCache
from .snapshot import Snapshot

log = structlog.get_logger(__name__)

Tier = Literal["l1", "l2"]


@dataclass(frozen=True)
class CacheHit:
    snapshot: Snapshot
    tier: Tier


class PrefixCache:
    """Longest exact-prefix reuse of session states, keyed by `SnapshotKey`."""

    def __init__(self, config: CacheConfig):
        self.config = config
        self.l1 = MemoryCache(config.l1_entries, config.l1_bytes)
        self.l2 = DiskCache(Path(config.l2_dir), config.l2_bytes) if config.l2_dir else None
        self.counters: dict[str, int] = {
            "hits_l1": 0,
            "hits_l2": 0,
            "misses": 0,
            "published": 0,
            "restored_tokens": 0,
            "computed_tokens": 0,
        }
        self._busy = 0  # requests running (disk writes wait while any does)
        self._busy_lock = threading.Lock()

    def lookup(self, key: SnapshotKey, tokens: Sequence[int]) -> CacheHit | None:
        """Longest snapshot whose tokens are an exact prefix of `tokens`, over both tiers.
        L2 is read when L1 misses, or when it holds a snapshot at least
        `l2_min_gain_tokens` longer than L1's hit (written by an earlier server or another
        process on the same directory, or evicted from L1); an L2 hit is promoted to L1. A
        snapshot covering all of `tokens` is fine: it carries the logits at its last
        position."""
        toks = tuple(tokens)
        hit = self.l1.lookup(key, toks)
        tier: Tier = "l1"
        if self.l2 is not None:
            gain = max(self.config.l2_min_gain_tokens, 1)  # strictly longer than L1's hit
            floor = 0 if hit is None else len(hit.tokens) + gain
            deeper = self.l2.lookup(key, toks, min_tokens=floor)
            if deeper is not None:
                self.l1.put(deeper)
                hit, tier = deeper, "l2"
        if hit is None:
            self.counters["misses"] += 1
            return None
        self.counters[f"hits_{tier}"] += 1
        return CacheHit(hit, tier)

    def publish(self, key: SnapshotKey, state: SessionState) -> None:
        """Make `state` reusable (L1 now, L2 in the background)."""
        snapshot = Snapshot(key=key, state=state)
        self.l1.put(snapshot)
        if self.l2 is not None:
            self.l2.put(snapshot)
        self.counters["published"] += 1

    def request_started(self) -> None:
        """The engine begins a request: background disk writes wait until no request runs.
        Held for decode too, not only the prefill: back-to-back agent turns leave no gap but
        the decode, and a snapshot write started there (one array save cannot be paused) ran
        into the next turn's prefill (opencode shape: warm-turn prefill 25-50% slower than
        the same prefill with nothing to write). Counted, so overlapping requests nest."""
        if self.l2 is None:
            return
        with self._busy_lock:
            self._busy += 1
            if self._busy == 1:
                self.l2.pause()

    def request_finished(self) -> None:
        if self.l2 is None:
            return
        with self._busy_lock:
            self._busy = max(self._busy - 1, 0)
            if self._busy == 0:
                self.l2.resume()

    def record_prefill(self, restored: int, computed: int) -> None:
        self.counters["restored_tokens"] += restored
        self.counters["computed_tokens"] += computed

    def stats(self) -> dict[str, int]:
        """Counters and sizes, for /metrics and /v1/status."""
        out = dict(self.counters)
        out["l1_entries"] = len(self.l1)
        out["l1_bytes"] = self.l1.nbytes
        if self.l2 is not None:
            out["l2_entries"] = len(self.l2)
            out["l2_bytes"] = self.l2.nbytes
            out.update({f"l2_{k}": v for k, v in self.l2.stats.items()})
        return out

    def close(self, timeout: float | None = None) -> None:
        """Write the disk tier's queued snapshots (at most `timeout` seconds, by default the
        config's), stop its writer; later publishes still fill L1 but no longer reach the
        disk. Idempotent."""
        if self.l2 is not None:
            self.l2.close(self.config.l2_close_timeout_s if timeout is None else timeout)
