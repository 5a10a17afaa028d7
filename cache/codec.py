"""Snapshot <-> (named arrays, JSON metadata), the on-disk form of the L2 tier."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from toolflash.cache.state import DraftState, LayerState, SessionState

from .key import SCHEMA_VERSION, SnapshotKey
from .snapshot import Snapshot


class SnapshotFormatError(ValueError):
    """Arrays or metadata that do not form a snapshot of this schema."""


def encode(snapshot: Snapshot) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Arrays to store and the metadata describing them (tokens included, so lookups need
    no array load)."""
    state = snapshot.state
    arrays: dict[str, mx.array] = {"last_logits": state.last_logits}
    kinds = []
    for i, layer in enumerate(state.layers):
        kinds.append(layer.kind)
        for j, a in enumerate(layer.arrays):
            arrays[f"layer.{i}.{j}"] = a
    draft_meta = None
    if state.draft is not None:
        d = state.draft
        for i, (k, v) in enumerate(zip(d.keys, d.values, strict=True)):
            arrays[f"draft.{i}.k"] = k
            arrays[f"draft.{i}.v"] = v
        draft_meta = {
            "layers": len(d.keys),
            "covered": d.covered,
            "sink": d.sink,
            "window": d.window,
            "feature_spans": snapshot.feature_spans(),
        }
    meta = {
        "schema": SCHEMA_VERSION,
        "key": snapshot.key.to_json(),
        "tokens": list(state.tokens),
        "layer_kinds": kinds,
        "layer_arrays": [len(layer.arrays) for layer in state.layers],
        "draft": draft_meta,
        "created": snapshot.created,
        "nbytes": snapshot.nbytes,
        "lineage": "dense",
    }
    return arrays, meta


def decode(arrays: dict[str, mx.array], meta: dict[str, Any]) -> Snapshot:
    """Rebuild a snapshot; raises SnapshotFormatError on anything inconsistent."""
    try:
        if meta.get("schema") != SCHEMA_VERSION or meta.get("lineage") != "dense":
            raise SnapshotFormatError(f"schema {meta.get('schema')} / {meta.get('lineage')}")
        key = SnapshotKey.from_json(meta["key"])
        layers = []
        for i, (kind, n) in enumerate(zip(meta["layer_kinds"], meta["layer_arrays"], strict=True)):
            if kind not in ("kv", "recurrent"):
                raise SnapshotFormatError(f"layer {i} kind {kind}")
            layers.append(LayerState(kind, tuple(arrays[f"layer.{i}.{j}"] for j in range(n))))
        draft = None
        if meta["draft"] is not None:
            dm = meta["draft"]
            n = int(dm["layers"])
            draft = DraftState(
                keys=tuple(arrays[f"draft.{i}.k"] for i in range(n)),
                values=tuple(arrays[f"draft.{i}.v"] for i in range(n)),
                covered=int(dm["covered"]),
                sink=int(dm["sink"]),
                window=None if dm["window"] is None else int(dm["window"]),
            )
        tokens = tuple(int(t) for t in meta["tokens"])
        for layer in layers:
            if layer.kind == "kv" and layer.arrays[0].shape[2] != len(tokens):
                raise SnapshotFormatError("KV length does not match the token count")
        state = SessionState(tokens, tuple(layers), draft, arrays["last_logits"])
        return Snapshot(key=key, state=state, created=float(meta.get("created", 0.0)))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, SnapshotFormatError):
            raise
        raise SnapshotFormatError(f"{type(exc).__name__}: {exc}") from exc
