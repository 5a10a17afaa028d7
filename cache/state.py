"""A session's resumable state at a token prefix: what a prefix-cache snapshot holds.

The state is immutable MLX arrays (MLX arrays are values: restoring into a cache and then
decoding never mutates the state it came from), so one state can be restored many times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

# "remote": layers held by other processes (a pipeline target's ranks), by reference.
LayerKind = Literal["kv", "recurrent", "remote"]


@dataclass(frozen=True)
class LayerState:
    """One target layer: attention K/V up to the prefix, or GatedDeltaNet conv + recurrent."""

    kind: LayerKind
    arrays: tuple[mx.array, ...]
    # Bytes this layer's state holds outside `arrays` (a pipeline's other ranks keep theirs),
    # so the prefix cache's byte budget counts the whole state.
    held_bytes: int = 0


@dataclass(frozen=True)
class DraftState:
    """The drafter context: per-layer K/V of retained rows and the positions they cover."""

    keys: tuple[mx.array, ...]
    values: tuple[mx.array, ...]
    covered: int  # positions [0, covered) were appended (the window may have trimmed some)
    sink: int
    window: int | None


@dataclass(frozen=True)
class SessionState:
    """Everything needed to resume decoding after `tokens` (all fed to the target).

    `last_logits` are the target's logits at the last position (they choose the next token).
    `draft` is None when the session had no drafter."""

    tokens: tuple[int, ...]
    layers: tuple[LayerState, ...]
    draft: DraftState | None
    last_logits: mx.array

    @property
    def nbytes(self) -> int:
        arrays: list[mx.array] = [self.last_logits]
        for layer in self.layers:
            arrays.extend(layer.arrays)
        if self.draft is not None:
            arrays.extend(self.draft.keys)
            arrays.extend(self.draft.values)
        return sum(a.nbytes for a in arrays) + sum(layer.held_bytes for layer in self.layers)

    def arrays(self) -> list[mx.array]:
        """All arrays, for mx.eval before the state leaves the decode path."""
        out: list[mx.array] = [self.last_logits]
        for layer in self.layers:
            out.extend(layer.arrays)
        if self.draft is not None:
            out.extend(self.draft.keys)
            out.extend(self.draft.values)
        return out


def export_cache(cache: list[Any]) -> tuple[LayerState, ...]:
    """Snapshot per-layer target caches (views of the used part, no copies). A cache that
    exports itself (a pipeline target's, engine/targets/pipeline.py) does so."""
    exporter = getattr(cache, "export_layers", None)
    if exporter is not None:
        return tuple(exporter())
    layers = []
    for c in cache:
        if isinstance(c, KVCache):
            keys, values = c.keys, c.values
            if keys is None or values is None:
                raise ValueError("cannot snapshot an empty KV cache")
            n = c.offset
            layers.append(LayerState("kv", (keys[..., :n, :], values[..., :n, :])))
        elif isinstance(c, ArraysCache):
            conv, rec = c[0], c[1]
            if conv is None or rec is None:
                raise ValueError("cannot snapshot an empty recurrent cache")
            layers.append(LayerState("recurrent", (conv, rec)))
        else:
            raise TypeError(f"unsupported cache type {type(c).__name__}")
    return tuple(layers)


def restore_cache(cache: list[Any], layers: tuple[LayerState, ...]) -> None:
    """Load `layers` into fresh caches of the same layout."""
    restorer = getattr(cache, "restore_layers", None)
    if restorer is not None:
        restorer(layers)
        return
    if len(cache) != len(layers):
        raise ValueError(f"state has {len(layers)} layers, the target {len(cache)}")
    for c, layer in zip(cache, layers, strict=True):
        if layer.kind == "kv" and isinstance(c, KVCache):
            keys, values = layer.arrays
            c.keys, c.values, c.offset = keys, values, int(keys.shape[2])
        elif layer.kind == "recurrent" and isinstance(c, ArraysCache):
            c[0], c[1] = layer.arrays
        else:
            raise ValueError(f"state layer kind {layer.kind} does not fit {type(c).__name__}")
