"""The running batch's target state: one batched cache per layer, a row per sequence.

mlx-lm's batch caches do the work: a sequence's own caches (`KVCache`, or `ArraysCache` for a
GatedDeltaNet layer's conv and recurrent state) join with `merge` + `extend` (attention keys
left-padded, each row keeps its own offset, so RoPE and the causal mask follow each sequence's
own positions), leave with `filter`, and come back out as single-sequence caches with
`extract`. Every batched forward feeds exactly one token per row, so no row ever holds padding
inside its recurrent state (the GatedDeltaNet rows need no mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ..targets.base import ForwardResult, TargetAdapter
from .verify import rollback_rows


class BatchRows:
    """Batched per-layer caches for the sequences in the batch, in row order."""

    def __init__(self, target: TargetAdapter) -> None:
        self.target = target
        self.layers: list[Any] | None = None  # None while the batch is empty
        self.size = 0

    def admit(self, cache: Sequence[Any]) -> int:
        """Take a sequence's per-layer caches as a new last row; its row index."""
        joined = [type(c).merge([c]) for c in cache]
        if self.layers is None:
            self.layers = joined
        else:
            for batch, row in zip(self.layers, joined):
                batch.extend(row)
        self.size += 1
        return self.size - 1

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (in that order); the others leave the batch at once."""
        if not rows:
            self.layers, self.size = None, 0
            return
        if list(rows) == list(range(self.size)):
            return
        assert self.layers is not None
        index = mx.array(list(rows))
        for layer in self.layers:
            layer.filter(index)
        self.size = len(rows)

    def extract(self, row: int) -> list[Any]:
        """Row `row` as a sequence's own per-layer caches (a copy: the batch keeps its row)."""
        assert self.layers is not None
        return [layer.extract(row) for layer in self.layers]

    def forward(
        self, tokens: Sequence[int | mx.array], capture: Sequence[int], keep_tape: bool = False
    ) -> ForwardResult:
        """One target forward of one token per row ([B, 1]); logits [B, 1, V], features
        [B, 1, F] when `capture` names layers. With `keep_tape`, `undo` can take it back."""
        assert self.layers is not None and len(tokens) == self.size
        column = mx.stack([mx.array(t).reshape(()) for t in tokens])[:, None].astype(mx.int32)
        return self.target.forward(column, self.layers, capture, keep_tape=keep_tape)

    def undo(self, result: ForwardResult) -> None:
        """Take back the last forward (`result`, run with keep_tape over these rows)."""
        assert self.layers is not None
        rollback_rows(self.layers, result, [0] * self.size)

    def verify(self, block: mx.array, capture: Sequence[int]) -> ForwardResult:
        """One target forward of a block per row ([B, L]), keeping what `rollback_rows`
        needs to keep a different prefix in each row."""
        assert self.layers is not None and block.shape[0] == self.size
        return self.target.forward(block, self.layers, capture, keep_tape=True)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers) if self.layers is not None else 0
