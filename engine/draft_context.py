"""The drafter's context: per-layer keys/values of fused target features, sink + rolling window.

Invariant: the context covers every committed position strictly before the current block's
first token, trimmed to its first `sink` rows plus its last `window` rows. Features arrive as
raw concatenated target layer outputs (`pending`) and are fused and projected only when the
drafter next runs, so target-only (AR) steps pay nothing for keeping it coherent. Rows carry
their absolute positions (RoPE and sliding-window masks use them), so a sparse prefill's
context with gaps is represented exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from toolflash.cache.state import DraftState

from .drafter import DFlashDrafter


@dataclass(frozen=True)
class DraftWindow:
    """How much context the drafter attends to: the first `sink` rows and the last `window`
    rows (dflash-mlx's defaults: 64 + 1024). window=None keeps everything."""

    sink: int = 64
    window: int | None = 1024

    def keeps(self, total: int) -> list[tuple[int, int]]:
        """Row ranges [start, end) retained out of `total` rows."""
        if self.window is None or total <= self.sink + self.window:
            return [(0, total)]
        return [(0, self.sink), (total - self.window, total)]


class DraftContext:
    """Per-layer context K/V for one session's drafter."""

    def __init__(self, drafter: DFlashDrafter, window: DraftWindow):
        self.drafter = drafter
        self.window = window
        self.keys: list[mx.array | None] = [None] * len(drafter.layers)
        self.values: list[mx.array | None] = [None] * len(drafter.layers)
        self.covered = 0  # one past the last position appended
        self._rows = 0  # rows seen (before trimming), i.e. `covered` for dense sessions
        self._row_positions: list[int] = []  # absolute position of each retained row
        self._pending: list[tuple[int, mx.array]] = []
        self._pending_rows = 0

    @property
    def positions(self) -> int:
        """The next position the context expects (dense sessions: rows covered)."""
        if self._pending:
            start, feats = self._pending[-1]
            return start + int(feats.shape[1])
        return self.covered

    def add_features(self, features: mx.array, start: int | None = None) -> None:
        """Queue raw target features [1, T, n*H] of T committed positions from `start`
        (default: right after the last ones)."""
        start = self.positions if start is None else start
        if start < self.positions:
            raise ValueError(f"features at {start} go backwards (context at {self.positions})")
        self._pending.append((start, features))
        self._pending_rows += int(features.shape[1])
        if self.window.window is not None and self._pending_rows > self.window.sink + (
            self.window.window
        ):
            # A long target-only stretch: absorb now so queued features stay bounded.
            self.absorb()

    def absorb(self) -> list[tuple[mx.array, mx.array]]:
        """Fuse and project pending features into the per-layer K/V; returns the K/V. Rows the
        window would drop right away are never projected."""
        for start, feats in _contiguous(self._pending):
            n = int(feats.shape[1])
            base = self._rows
            total = base + n
            new_k: list[list[mx.array]] = [[] for _ in self.drafter.layers]
            new_v: list[list[mx.array]] = [[] for _ in self.drafter.layers]
            for r0, r1 in self.window.keeps(total):
                r0 = max(r0, base)
                if r1 <= r0:
                    continue
                fused = self.drafter.fuse(feats[:, r0 - base : r1 - base])
                for i, (k, v) in enumerate(self.drafter.context_kv(fused, start + r0 - base)):
                    new_k[i].append(k)
                    new_v[i].append(v)
                self._row_positions.extend(range(start + r0 - base, start + r1 - base))
            for i in range(len(self.drafter.layers)):
                self.keys[i] = _append(self.keys[i], new_k[i])
                self.values[i] = _append(self.values[i], new_v[i])
            self._rows = total
            self.covered = start + n
            self._trim()
        self._pending, self._pending_rows = [], 0
        return [(k, v) for k, v in zip(self.keys, self.values) if k is not None and v is not None]

    def arrays(self) -> list[mx.array]:
        """Every array the context holds (K/V and queued features)."""
        held = [a for a in (*self.keys, *self.values) if a is not None]
        return held + [feats for _, feats in self._pending]

    def export_state(self) -> DraftState:
        """The context with pending features absorbed (so the state is self-contained)."""
        self.absorb()
        if self._row_positions != [
            p for s, e in self.window.keeps(self.covered) for p in range(s, e)
        ]:
            raise ValueError("a drafter context with position gaps is not a dense state")
        keys = tuple(k for k in self.keys if k is not None)
        values = tuple(v for v in self.values if v is not None)
        return DraftState(keys, values, self.covered, self.window.sink, self.window.window)

    def load_state(self, state: DraftState) -> None:
        """Resume from a dense `state`; it must have been made with this drafter's window."""
        if (state.sink, state.window) != (self.window.sink, self.window.window):
            raise ValueError(
                f"drafter context made with sink/window {state.sink}/{state.window}, "
                f"this session uses {self.window.sink}/{self.window.window}"
            )
        if len(state.keys) not in (0, len(self.keys)):
            raise ValueError("drafter context state has another number of layers")
        if state.keys:
            self.keys, self.values = list(state.keys), list(state.values)
        self.covered = self._rows = state.covered
        self._row_positions = [p for s, e in self.window.keeps(state.covered) for p in range(s, e)]
        self._pending, self._pending_rows = [], 0

    def positions_array(self) -> mx.array:
        """Absolute positions of the retained context rows (after `absorb`)."""
        return mx.array(self._row_positions, dtype=mx.int32)

    def _trim(self) -> None:
        w = self.window
        keys0 = self.keys[0]
        if w.window is None or keys0 is None or keys0.shape[2] <= w.sink + w.window:
            return
        sink = w.sink
        for i in range(len(self.keys)):
            k, v = self.keys[i], self.values[i]
            assert k is not None and v is not None
            self.keys[i] = mx.concatenate([k[:, :, :sink], k[:, :, -w.window :]], axis=2)
            self.values[i] = mx.concatenate([v[:, :, :sink], v[:, :, -w.window :]], axis=2)
        self._row_positions = self._row_positions[:sink] + self._row_positions[-w.window :]


def _append(existing: mx.array | None, parts: list[mx.array]) -> mx.array | None:
    if existing is not None:
        parts = [existing, *parts]
    if not parts:
        return existing
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)


def _contiguous(pending: list[tuple[int, mx.array]]) -> list[tuple[int, mx.array]]:
    """Pending features joined where their positions follow on: an AR stretch queues one row
    per step, and projecting each row on its own costs a graph per step when speculation
    resumes (or the state is exported); joined, the stretch is one projection."""
    runs: list[tuple[int, list[mx.array], int]] = []
    for start, feats in pending:
        n = int(feats.shape[1])
        if runs and runs[-1][0] + runs[-1][2] == start:
            first, parts, rows = runs[-1]
            runs[-1] = (first, [*parts, feats], rows + n)
        else:
            runs.append((start, [feats], n))
    return [(s, p[0] if len(p) == 1 else mx.concatenate(p, axis=1)) for s, p, _ in runs]
