"""The L2 tier's metadata files, checked field by field before anything trusts them.

A metadata file is whatever is on the disk: written by this version, an older one, another
program, or damaged. `read_meta` returns a `DiskMeta` only when every field the tier relies on
has the right type and range; anything else raises `SnapshotFormatError`, never another
exception (a wrong type once ended start-up with an AssertionError, deep nesting with a
RecursionError). Pure: no arrays are loaded here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .codec import SnapshotFormatError
from .key import SCHEMA_VERSION, SnapshotKey

# Larger than any metadata this tier writes (a token list for a 1M-token prompt is ~8 MB).
MAX_META_BYTES = 32 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_KEY_STRINGS = ("target_id", "template_hash", "dtype")
_KEY_OPTIONAL_STRINGS = ("draft_id",)
_KEY_OPTIONAL_INTS = ("draft_sink", "draft_window")


@dataclass(frozen=True)
class DiskMeta:
    """What the index keeps from a metadata file."""

    key: SnapshotKey
    tokens: tuple[int, ...]
    file_bytes: int
    checksum: str
    raw: dict[str, Any]  # the whole mapping, for the codec once the data is loaded


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise SnapshotFormatError(what)


def parse_key(d: Any) -> SnapshotKey:
    """A `SnapshotKey` from its JSON form, every field type-checked."""
    _need(isinstance(d, dict), "key is not an object")
    for name in _KEY_STRINGS:
        _need(isinstance(d.get(name), str), f"key.{name} is not a string")
    for name in _KEY_OPTIONAL_STRINGS:
        _need(d.get(name) is None or isinstance(d[name], str), f"key.{name} is not a string")
    for name in _KEY_OPTIONAL_INTS:
        _need(d.get(name) is None or _is_int(d[name]), f"key.{name} is not an integer")
    ids = d.get("target_layer_ids")
    _need(
        isinstance(ids, list) and all(_is_int(i) and i >= 0 for i in ids),
        "key.target_layer_ids is not a list of layer indices",
    )
    _need(_is_int(d.get("schema")), "key.schema is not an integer")
    return SnapshotKey.from_json(d)


def _check_layout(meta: dict[str, Any], n_tokens: int) -> None:
    kinds: Any = meta.get("layer_kinds")
    counts: Any = meta.get("layer_arrays")
    _need(
        isinstance(kinds, list) and all(k in ("kv", "recurrent") for k in kinds),
        "layer_kinds is not a list of layer kinds",
    )
    _need(
        isinstance(counts, list)
        and len(counts) == len(kinds)
        and all(_is_int(n) and 0 <= n <= 64 for n in counts),
        "layer_arrays does not match layer_kinds",
    )
    draft = meta.get("draft")
    if draft is not None:
        _need(isinstance(draft, dict), "draft is not an object")
        for name in ("layers", "covered", "sink"):
            _need(_is_int(draft.get(name)) and draft[name] >= 0, f"draft.{name} is not a count")
        _need(draft["covered"] <= n_tokens, "draft.covered exceeds the tokens")
        window = draft.get("window")
        _need(window is None or (_is_int(window) and window >= 0), "draft.window is not a count")
    _need(meta.get("lineage") == "dense", "lineage is not dense")
    created = meta.get("created", 0.0)
    _need(isinstance(created, int | float) and not isinstance(created, bool), "bad created")


def parse_meta(text: str, ident: str, snapshot_id: Any) -> DiskMeta:
    """Check a metadata file's text for the snapshot `ident`; `snapshot_id(key, tokens)` must
    give `ident` back (a file renamed or edited is foreign)."""
    try:
        meta = json.loads(text)
    except RecursionError:
        raise SnapshotFormatError("metadata nested too deeply") from None
    except ValueError as exc:
        raise SnapshotFormatError(f"metadata is not JSON: {exc}") from None
    _need(isinstance(meta, dict), "metadata is not an object")
    _need(_is_int(meta.get("schema")) and meta["schema"] == SCHEMA_VERSION, "other schema")
    key = parse_key(meta.get("key"))
    tokens = meta.get("tokens")
    _need(
        isinstance(tokens, list) and all(_is_int(t) and t >= 0 for t in tokens),
        "tokens is not a list of token ids",
    )
    size = meta.get("file_bytes")
    _need(_is_int(size) and size > 0, "file_bytes is not a size")
    checksum = meta.get("checksum")
    _need(isinstance(checksum, str) and bool(_HEX64.fullmatch(checksum)), "bad checksum")
    _check_layout(meta, len(tokens))
    token_tuple = tuple(tokens)
    _need(snapshot_id(key, token_tuple) == ident, "identity mismatch")
    return DiskMeta(key, token_tuple, size, checksum, meta)
