"""The drafter's context: per-layer keys/values of fused target features, sink + rolling window.

Invariant: the context covers every committed position strictly before the current block's
first token (trimmed to the first `sink` positions plus the last `window` positions). Features
arrive as raw concatenated target layer outputs (`pending`) and are fused and projected only
when the drafter next runs, so target-only (AR) steps pay nothing for keeping it coherent.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .drafter import DFlashDrafter
from .state import DraftState


@dataclass(frozen=True)
class DraftWindow:
    """How much context the drafter attends to: the first `sink` positions and the last
    `window` positions (dflash-mlx's defaults: 64 + 1024). window=None keeps everything."""

    sink: int = 64
    window: int | None = 1024

    def keeps(self, total: int) -> list[tuple[int, int]]:
        """Position ranges [start, end) retained out of `total` positions."""
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
        self.covered = 0  # positions [0, covered) have been appended (some may be trimmed)
        self._pending: list[mx.array] = []
        self._pending_rows = 0

    @property
    def positions(self) -> int:
        """Positions the context will cover once pending features are absorbed."""
        return self.covered + self._pending_rows

    def add_features(self, features: mx.array) -> None:
        """Queue raw target features [1, T, n*H] of the next T committed positions."""
        self._pending.append(features)
        self._pending_rows += int(features.shape[1])
        if self.window.window is not None and self._pending_rows > self.window.sink + (
            self.window.window
        ):
            # A long target-only stretch: absorb now so queued features stay bounded.
            self.absorb()

    def absorb(self) -> list[tuple[mx.array, mx.array]]:
        """Fuse and project pending features into the per-layer K/V; returns the K/V."""
        if self._pending:
            feats = (
                self._pending[0]
                if len(self._pending) == 1
                else mx.concatenate(self._pending, axis=1)
            )
            start = self.covered
            total = start + int(feats.shape[1])
            new_k: list[list[mx.array]] = [[] for _ in self.drafter.layers]
            new_v: list[list[mx.array]] = [[] for _ in self.drafter.layers]
            for s, e in self.window.keeps(total):
                s = max(s, start)
                if e <= s:
                    continue
                fused = self.drafter.fuse(feats[:, s - start : e - start])
                for i, (k, v) in enumerate(self.drafter.context_kv(fused, s)):
                    new_k[i].append(k)
                    new_v[i].append(v)
            for i in range(len(self.drafter.layers)):
                self.keys[i] = _append(self.keys[i], new_k[i])
                self.values[i] = _append(self.values[i], new_v[i])
            self.covered = total
            self._pending, self._pending_rows = [], 0
            self._trim()
        return [(k, v) for k, v in zip(self.keys, self.values) if k is not None and v is not None]

    def export_state(self) -> DraftState:
        """The context with pending features absorbed (so the state is self-contained)."""
        self.absorb()
        keys = tuple(k for k in self.keys if k is not None)
        values = tuple(v for v in self.values if v is not None)
        return DraftState(keys, values, self.covered, self.window.sink, self.window.window)

    def load_state(self, state: DraftState) -> None:
        """Resume from `state`; it must have been made with this drafter's window."""
        if (state.sink, state.window) != (self.window.sink, self.window.window):
            raise ValueError(
                f"drafter context made with sink/window {state.sink}/{state.window}, "
                f"this session uses {self.window.sink}/{self.window.window}"
            )
        if len(state.keys) not in (0, len(self.keys)):
            raise ValueError("drafter context state has another number of layers")
        if state.keys:
            self.keys, self.values = list(state.keys), list(state.values)
        self.covered = state.covered
        self._pending, self._pending_rows = [], 0

    def positions_array(self) -> mx.array:
        """Absolute positions of the retained context rows (after `absorb`)."""
        return mx.concatenate([mx.arange(s, e) for s, e in self.window.keeps(self.covered)])

    def _trim(self) -> None:
        w = self.window
        if w.window is None:
            return
        keys0 = self.keys[0]
        if keys0 is None or keys0.shape[2] <= w.sink + w.window:
            return
        sink = min(w.sink, self.covered)
        for i in range(len(self.keys)):
            k, v = self.keys[i], self.values[i]
            assert k is not None and v is not None
            self.keys[i] = mx.concatenate([k[:, :, :sink], k[:, :, -w.window :]], axis=2)
            self.values[i] = mx.concatenate([v[:, :, :sink], v[:, :, -w.window :]], axis=2)


def _append(existing: mx.array | None, parts: list[mx.array]) -> mx.array | None:
    if existing is not None:
        parts = [existing, *parts]
    if not parts:
        return existing
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)
