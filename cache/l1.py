"""L1: snapshots in memory, LRU under an entry budget and a byte budget."""

from __future__ import annotations

import threading
from collections import OrderedDict

from .key import SnapshotKey
from .snapshot import Snapshot, is_prefix


class MemoryCache:
    """Longest-exact-prefix lookup over recently used snapshots."""

    def __init__(self, max_entries: int = 32, max_bytes: int = 2 << 30):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], Snapshot] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, key: SnapshotKey, tokens: tuple[int, ...] | list[int]) -> Snapshot | None:
        """The longest snapshot with this key whose tokens are a prefix of `tokens`."""
        with self._lock:
            best: tuple[str, tuple[int, ...]] | None = None
            for digest, toks in self._entries:
                if digest == key.digest and is_prefix(toks, tokens):
                    if best is None or len(toks) > len(best[1]):
                        best = (digest, toks)
            if best is None:
                return None
            self._entries.move_to_end(best)
            return self._entries[best]

    def put(self, snapshot: Snapshot) -> list[Snapshot]:
        """Insert (or refresh) a snapshot; returns the snapshots evicted for budget."""
        ident = (snapshot.key.digest, snapshot.tokens)
        evicted: list[Snapshot] = []
        with self._lock:
            old = self._entries.pop(ident, None)
            if old is not None:
                self._bytes -= old.nbytes
            if snapshot.nbytes > self.max_bytes or self.max_entries <= 0:
                return [snapshot]
            self._entries[ident] = snapshot
            self._bytes += snapshot.nbytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, victim = self._entries.popitem(last=False)
                self._bytes -= victim.nbytes
                evicted.append(victim)
        return evicted
