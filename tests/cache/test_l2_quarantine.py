"""A damaged disk cache never stops start-up or a lookup: every file the L2 tier cannot fully
validate is moved to `quarantine/` and counted, and intact snapshots are still served."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from toolflash.cache.key import SnapshotKey
from toolflash.cache.l2 import DiskCache
from toolflash.cache.snapshot import Snapshot
from toolflash.cache.state import LayerState, SessionState

KEY = SnapshotKey("t", None, (), None, None, "h", "float32")


def snapshot(tokens: tuple[int, ...]) -> Snapshot:
    n = len(tokens)
    kv = LayerState("kv", (mx.ones((1, 2, n, 4)), mx.zeros((1, 2, n, 4))))
    state = SessionState(tokens, (kv,), None, mx.arange(8, dtype=mx.float32))
    return Snapshot(KEY, state)


def _meta(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path, Path], None]:
    def damage(meta: Path, data: Path) -> None:
        d = json.loads(meta.read_text())
        edit(d)
        meta.write_text(json.dumps(d))

    return damage


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        d[last] = value

    return edit


def _flip(meta: Path, data: Path) -> None:
    raw = data.read_bytes()
    data.write_bytes(raw[:-10] + bytes(b ^ 0xFF for b in raw[-10:]))


def _dir_meta(meta: Path, data: Path) -> None:
    meta.unlink()
    meta.mkdir()


# The kinds of damage the hardening run applied (issue #26): 20 kinds.
DAMAGE: dict[str, Callable[[Path, Path], None]] = {
    "garbage_json": lambda m, d: m.write_text("{not json"),
    "empty_meta": lambda m, d: m.write_text(""),
    "meta_not_object": lambda m, d: m.write_text("[1, 2, 3]"),
    "deep_nesting": lambda m, d: m.write_text("[" * 100_000 + "]" * 100_000),
    "deep_nesting_in_key": _meta(_set("key", json.loads("[" * 500 + "]" * 500))),
    "layer_ids_wrong_type": _meta(_set("key.target_layer_ids", "1,2,3")),
    "schema_wrong_type": _meta(_set("schema", "1")),
    "key_wrong_type": _meta(_set("key", ["t"])),
    "tokens_strings": _meta(_set("tokens", ["a", "b"])),
    "tokens_negative": _meta(_set("tokens", [-1, 5])),
    "file_bytes_string": _meta(_set("file_bytes", "12")),
    "checksum_other": _meta(_set("checksum", "0" * 64)),
    "checksum_not_hex": _meta(_set("checksum", {"x": 1})),
    "layer_kind_unknown": _meta(_set("layer_kinds", ["mamba"])),
    "layer_arrays_mismatch": _meta(_set("layer_arrays", [2, 2, 2])),
    "draft_wrong_type": _meta(_set("draft", "yes")),
    "meta_invalid_utf8": lambda m, d: m.write_bytes(b'{"schema": "\xff\xfe"}'),
    "data_flipped": _flip,
    "data_truncated": lambda m, d: d.write_bytes(d.read_bytes()[:40]),
    "data_missing": lambda m, d: d.unlink(),
    "meta_is_directory": _dir_meta,
}


def _written(directory: Path, count: int) -> DiskCache:
    cache = DiskCache(directory)
    for i in range(count):
        assert cache.put(snapshot(tuple(range(i + 1, i + 6))))
        cache.flush()  # the write queue is bounded
    cache.close()
    return cache


def _pairs(directory: Path) -> list[tuple[Path, Path]]:
    metas = sorted(directory.glob("*.json"))
    return [(m, m.with_suffix(".safetensors")) for m in metas]


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_each_kind_of_damage_is_quarantined_at_start_up(tmp_path: Path, kind: str) -> None:
    _written(tmp_path, 2)
    (meta, data), (good_meta, _) = _pairs(tmp_path)
    DAMAGE[kind](meta, data)
    cache = DiskCache(tmp_path)  # start-up: never raises
    good = tuple(json.loads(good_meta.read_text())["tokens"])
    # Damage the start-up scan cannot see (data, checksums) is found at the lookup.
    for tokens in (good, tuple(range(1, 6)), tuple(range(2, 7))):
        cache.lookup(KEY, tokens)
    assert cache.stats["quarantined"] == 1, cache.stats
    assert meta.name in {p.name for p in (tmp_path / "quarantine").iterdir()}
    hit = cache.lookup(KEY, good)
    assert hit is not None and hit.tokens == good  # the intact snapshot is still served
    cache.close()


def test_a_hundred_damaged_files_of_every_kind(tmp_path: Path) -> None:
    _written(tmp_path, 105)
    pairs = _pairs(tmp_path)
    kinds = sorted(DAMAGE)
    damaged = pairs[:100]
    for i, (meta, data) in enumerate(damaged):
        DAMAGE[kinds[i % len(kinds)]](meta, data)
    cache = DiskCache(tmp_path)
    for i in range(105):
        cache.lookup(KEY, tuple(range(i + 1, i + 6)))
    assert cache.stats["quarantined"] == 100
    assert len(cache) == 5 and len(list(tmp_path.glob("*.json"))) == 5
    assert len(list((tmp_path / "quarantine").glob("*.json"))) == 100
    cache.close()


def test_data_damage_is_found_in_the_background_without_a_lookup(tmp_path: Path) -> None:
    """Start-up checks metadata at once; the writer checksums the data while idle, so damage
    no request would read is quarantined too, and intact files are counted verified."""
    _written(tmp_path, 3)
    (meta, data), *_ = _pairs(tmp_path)
    _flip(meta, data)
    cache = DiskCache(tmp_path)
    deadline = time.monotonic() + 10
    while cache.stats["verified"] + cache.stats["quarantined"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cache.stats["quarantined"] == 1 and cache.stats["verified"] == 2, cache.stats
    assert not meta.exists() and len(cache) == 2
    cache.close()
