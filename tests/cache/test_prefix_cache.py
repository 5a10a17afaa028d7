"""Prefix cache: restore equals recompute (both families, both modes, L1 and L2), every guard
case, and L2 faults."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from toolflash.cache.key import SnapshotKey
from toolflash.cache.l2 import DiskCache
from toolflash.cache.prefix_cache import CacheConfig, PrefixCache
from toolflash.cache.snapshot import Snapshot
from toolflash.cache.state import SessionState
from toolflash.engine.api import FinishEvent, GenerationRequest, Mode, TokenEvent
from toolflash.engine.draft_context import DraftWindow
from toolflash.engine.factory import build_engine

from ..engine.model_dirs import write_draft, write_qwen3_target, write_qwen35_target

FAMILIES = {"qwen3": write_qwen3_target, "qwen3_5": write_qwen35_target}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model_dirs(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp(request.param)
    config = FAMILIES[request.param](root / "target")
    write_draft(root / "draft", config)
    return root / "target", root / "draft"


def engine_for(dirs: tuple[Path, Path], cache: PrefixCache | None, **kw: Any) -> Any:
    engine = build_engine(str(dirs[0]), str(dirs[1]), **kw)
    engine.prefix_cache = cache
    return engine


def run(
    engine: Any, prompt: list[int], mode: Mode = "spec", n: int = 24, **kw: Any
) -> tuple[list[int], Any]:
    tokens: list[int] = []
    finish = None
    request = GenerationRequest(tuple(prompt), n, mode=mode, **kw)
    for event in engine.generate(request):
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            finish = event
    return tokens, finish.stats if finish else None


def turn_prompts(engine: Any) -> tuple[list[int], int, list[int]]:
    """A first-turn prompt with its stable prefix, and a builder for the second turn."""
    history = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "def add(a, b):"},
    ]
    prompt = engine.encode_chat(history)
    stable = engine.stable_prefix(history[:1], None, None, prompt)  # system prompt only
    assert 0 < stable < len(prompt)
    assert engine.stable_prefix(history, None, None, prompt) > stable
    return prompt, stable, history  # type: ignore[return-value]


@pytest.mark.parametrize("mode", ["spec", "ar"])
@pytest.mark.parametrize("tier", ["l1", "l2"])
def test_restore_equals_recompute(model_dirs: Any, tmp_path: Path, mode: Mode, tier: str) -> None:
    cold = engine_for(model_dirs, None)
    prompt, stable, _ = turn_prompts(cold)
    out1, _ = run(cold, prompt, mode)
    turn2 = [*prompt, *out1, *cold.encode("\nimport os\n")]
    want, _ = run(cold, turn2, mode)

    cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path / "l2")))
    warm = engine_for(model_dirs, cache)
    first, stats1 = run(warm, prompt, mode, publish_at=(stable,))
    assert first == out1 and stats1.cached_tokens == 0
    if tier == "l2":
        assert cache.l2 is not None
        cache.l2.flush()
        cache.close()
        cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path / "l2")))  # "restart"
        warm.prefix_cache = cache
    got, stats2 = run(warm, turn2, mode)
    assert got == want
    # End-of-request snapshot: prompt + output minus the staged last token.
    assert stats2.cached_tokens == len(prompt) + len(out1) - 1
    assert cache.counters[f"hits_{tier}"] == 1


def test_stable_prefix_hit_when_the_turn_diverges(model_dirs: Any) -> None:
    cache = PrefixCache(CacheConfig())
    engine = engine_for(model_dirs, cache)
    prompt, stable, history = turn_prompts(engine)
    run(engine, prompt, publish_at=(stable,))
    # Same system prompt, a different user turn: only the stable prefix is reusable.
    other = engine.encode_chat([history[0], {"role": "user", "content": "import os"}])
    cold = engine_for(model_dirs, None)
    want, _ = run(cold, other)
    got, stats = run(engine, other)
    assert got == want and stats.cached_tokens == stable


def test_guard_key_changes_are_misses(model_dirs: Any, tmp_path: Path) -> None:
    cache = PrefixCache(CacheConfig())
    engine = engine_for(model_dirs, cache)
    prompt, stable, _ = turn_prompts(engine)
    run(engine, prompt, publish_at=(stable,))
    key = engine.cache_key
    assert cache.lookup(key, prompt) is not None
    for change in (
        {"template_hash": "other-template"},
        {"draft_id": "another-drafter"},
        {"draft_window": 77},
        {"draft_sink": 3},
        {"target_layer_ids": (0, 1)},
        {"schema": key.schema + 1},
    ):
        assert cache.lookup(replace(key, **change), prompt) is None, change
    # A drafter configured with another window never reuses these snapshots.
    other = engine_for(model_dirs, cache, window=DraftWindow(sink=8, window=64))
    _, stats = run(other, prompt)
    assert stats.cached_tokens == 0


def test_sparse_lineage_cannot_be_published() -> None:
    class SparseState(SessionState):
        pass

    state = SparseState((1,), (), None, mx.zeros((4,)))
    key = SnapshotKey("t", None, (), None, None, "h", "float32")
    with pytest.raises(TypeError, match="only dense SessionState"):
        Snapshot(key=key, state=state)


def test_no_token_after_a_stop_is_cached(model_dirs: Any) -> None:
    cache = PrefixCache(CacheConfig())
    engine = engine_for(model_dirs, cache)
    prompt, _, _ = turn_prompts(engine)
    free, _ = run(engine_for(model_dirs, None), prompt, n=30)
    stop_tok = free[10]
    stop_at = free.index(stop_tok)
    out, _ = run(engine, prompt, n=30, stop_token_ids=frozenset({stop_tok}))
    assert out == free[: stop_at + 1]
    snap = cache.l1.lookup(engine.cache_key, [*prompt, *free])
    assert snap is not None
    # The cached state ends right before the stop token (the stop token itself was never fed).
    assert snap.tokens == tuple([*prompt, *free[:stop_at]])
    for layer in snap.state.layers:
        if layer.kind == "kv":
            assert layer.arrays[0].shape[2] == len(snap.tokens)


def _published_l2(model_dirs: Any, directory: Path) -> tuple[Any, list[int], Path]:
    cache = PrefixCache(CacheConfig(l2_dir=str(directory)))
    engine = engine_for(model_dirs, cache)
    prompt, stable, _ = turn_prompts(engine)
    out, _ = run(engine, prompt, publish_at=(stable,))
    assert cache.l2 is not None
    cache.l2.flush()
    cache.close()
    return engine, [*prompt, *out], directory


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign-meta", "garbage-json"])
def test_l2_damaged_files_are_skipped_and_removed(
    model_dirs: Any, tmp_path: Path, damage: str
) -> None:
    engine, turn2, directory = _published_l2(model_dirs, tmp_path / "l2")
    prompt = turn2[:-1]  # covers both snapshots: the stable prefix and the end of request
    datas = sorted(directory.glob("*.safetensors"))
    assert len(datas) == 2  # stable prefix + end of request
    for data in datas:
        meta = data.with_suffix(".json")
        raw = data.read_bytes()
        if damage == "flip":
            data.write_bytes(raw[:-10] + bytes(b ^ 0xFF for b in raw[-10:]))
        elif damage == "truncate":
            data.write_bytes(raw[: len(raw) // 2])
        elif damage == "foreign-meta":
            meta.write_text(json.dumps({"hello": "world"}))
        else:
            meta.write_text("{not json")
    cache = PrefixCache(CacheConfig(l2_dir=str(directory)))
    assert cache.lookup(engine.cache_key, prompt) is None
    assert not list(directory.glob("*.safetensors")) and not list(directory.glob("*.json"))
    # And it keeps serving: the next request recomputes and publishes again.
    engine.prefix_cache = cache
    _, stats = run(engine, prompt)
    assert stats.cached_tokens == 0
    cache.close()


def test_a_longer_l2_snapshot_beats_a_shorter_l1_hit(model_dirs: Any, tmp_path: Path) -> None:
    """After a restart, L1 holds what this process saw (here the stable prefix) while the disk
    holds the earlier server's end-of-request snapshot: the longer one wins when it gains at
    least `l2_min_gain_tokens`, and is then served from L1."""
    engine, turn2, directory = _published_l2(model_dirs, tmp_path / "l2")
    prompt = turn2[:-1]
    _, stable, _ = turn_prompts(engine)
    end = len(turn2) - 1  # the end-of-request snapshot (the staged last token is not in it)

    def restarted(min_gain: int) -> PrefixCache:
        cache = PrefixCache(CacheConfig(l2_dir=str(directory), l2_min_gain_tokens=min_gain))
        diverging = [*prompt[:stable], *engine.encode("zzz unrelated")]
        first = cache.lookup(engine.cache_key, diverging)  # L1 miss: the stable prefix, from L2
        assert first is not None and first.tier == "l2" and len(first.snapshot.tokens) == stable
        return cache

    cache = restarted(min_gain=end - stable)
    hit = cache.lookup(engine.cache_key, prompt)
    assert hit is not None and hit.tier == "l2" and len(hit.snapshot.tokens) == end
    again = cache.lookup(engine.cache_key, prompt)
    assert again is not None and again.tier == "l1" and len(again.snapshot.tokens) == end
    assert cache.counters["hits_l2"] == 2 and cache.counters["hits_l1"] == 1
    cache.close()

    cache = restarted(min_gain=end - stable + 1)  # gains one token too few: L1's hit stands
    hit = cache.lookup(engine.cache_key, prompt)
    assert hit is not None and hit.tier == "l1" and len(hit.snapshot.tokens) == stable
    cache.close()

    # A longer disk snapshot that turns out damaged falls back to L1's hit, not to a miss.
    cache = restarted(min_gain=0)
    for data in directory.glob("*.safetensors"):
        if data.stat().st_size == max(p.stat().st_size for p in directory.glob("*.safetensors")):
            data.write_bytes(data.read_bytes()[:100])
    hit = cache.lookup(engine.cache_key, prompt)
    assert hit is not None and hit.tier == "l1" and len(hit.snapshot.tokens) == stable
    cache.close()


def test_l2_disk_full_drops_the_snapshot_and_keeps_serving(
    model_dirs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mx, "save_safetensors", full)
    cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path / "l2")))
    engine = engine_for(model_dirs, cache)
    prompt, stable, _ = turn_prompts(engine)
    out1, _ = run(engine, prompt, publish_at=(stable,))
    assert cache.l2 is not None
    cache.l2.flush()
    assert cache.l2.stats["write_errors"] == 2 and len(cache.l2) == 0
    assert not list((tmp_path / "l2").iterdir())  # no partial files left
    out2, stats = run(engine, prompt)  # L1 still serves
    assert out2 == out1 and stats.cached_tokens > 0
    cache.close()


def test_l2_budget_is_lru_refreshed_on_hit(model_dirs: Any, tmp_path: Path) -> None:
    engine, turn2, directory = _published_l2(model_dirs, tmp_path / "l2")
    prompt = turn2[:-1]
    sizes = [p.stat().st_size for p in directory.glob("*.safetensors")]
    cache = PrefixCache(
        CacheConfig(l1_entries=0, l2_dir=str(directory), l2_bytes=sum(sizes) + max(sizes) // 2)
    )
    engine.prefix_cache = cache
    stable_hit = cache.lookup(engine.cache_key, prompt)  # refreshes the end-of-request entry
    assert stable_hit is not None
    other = engine.encode_chat([{"role": "user", "content": "print(1)"}])
    run(engine, other)  # publishes one more: the least recently used must go
    assert cache.l2 is not None
    cache.l2.flush()
    assert cache.l2.stats["evictions"] >= 1
    assert cache.lookup(engine.cache_key, prompt) is not None  # the refreshed one survived
    cache.close()


def test_two_processes_share_one_directory(model_dirs: Any, tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    engine, turn2, _ = _published_l2(model_dirs, directory)
    prompt = turn2[:-1]
    # A second process writes its own snapshot into the same directory while we read ours.
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.engine.model_dirs import *
        from toolflash.cache.prefix_cache import CacheConfig, PrefixCache
        from toolflash.engine.factory import build_engine
        from toolflash.engine.api import GenerationRequest
        engine = build_engine({str(model_dirs[0])!r}, {str(model_dirs[1])!r})
        engine.prefix_cache = PrefixCache(CacheConfig(l2_dir={str(directory)!r}))
        prompt = engine.encode_chat([{{"role": "user", "content": "import sys"}}])
        events = list(engine.generate(GenerationRequest(tuple(prompt), 8)))
        engine.prefix_cache.close()
        print(json.dumps(prompt + [t for e in events[:-1] for t in e.token_ids]))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    cache = PrefixCache(CacheConfig(l1_entries=0, l2_dir=str(directory)))
    for _ in range(5):
        assert cache.lookup(engine.cache_key, prompt) is not None
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    theirs = json.loads(out.strip().splitlines()[-1])
    assert cache.lookup(engine.cache_key, theirs) is not None  # seen after their write
    assert len(list(directory.glob("*.json"))) == 3
    cache.close()


def test_l1_entry_and_byte_budgets(model_dirs: Any) -> None:
    cache = PrefixCache(CacheConfig(l1_entries=2))
    engine = engine_for(model_dirs, cache)
    for text in ("a", "b", "c"):
        run(engine, engine.encode_chat([{"role": "user", "content": text}]), n=4)
    assert len(cache.l1) == 2
    tiny = PrefixCache(CacheConfig(l1_bytes=1))
    engine.prefix_cache = tiny
    run(engine, engine.encode_chat([{"role": "user", "content": "a"}]), n=4)
    assert len(tiny.l1) == 0


def test_disk_cache_ignores_unrelated_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "x.json").write_text("[1, 2, 3]")
    cache = DiskCache(tmp_path)
    assert len(cache) == 0 and (tmp_path / "notes.txt").exists()
    cache.close()


def test_snapshots_are_published_after_the_first_token(model_dirs: Any, tmp_path: Path) -> None:
    """The stable-prefix snapshot reached during prefill is published only once the first
    token is out (publishing must not delay TTFT), also when the consumer stops there, and
    restoring it still equals recomputing."""
    cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path / "l2")))
    engine = engine_for(model_dirs, cache)
    prompt, stable, history = turn_prompts(engine)
    events = engine.generate(GenerationRequest(tuple(prompt), 8, publish_at=(stable,)))
    assert isinstance(next(events), TokenEvent)
    assert cache.counters["published"] == 0 and len(cache.l1) == 0
    events.close()  # the client went away right after the first token
    assert cache.counters["published"] == 1
    hit = cache.lookup(engine.cache_key, prompt)
    assert hit is not None and len(hit.snapshot.tokens) == stable
    other = engine.encode_chat([history[0], {"role": "user", "content": "import os"}])
    want, _ = run(engine_for(model_dirs, None), other)
    got, stats = run(engine, other)
    assert got == want and stats.cached_tokens == stable
    cache.close()


def test_l2_writes_wait_while_a_request_runs(model_dirs: Any, tmp_path: Path) -> None:
    """Disk writes queued while a request runs (prefill or decode) start only after every
    running request has finished (or the defer limit)."""
    cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path / "l2")))
    engine = engine_for(model_dirs, cache)
    prompt, stable, _ = turn_prompts(engine)
    run(engine, prompt, n=4, publish_at=(stable,))
    assert cache.l2 is not None
    cache.l2.flush()
    assert len(cache.l2) == 2
    hit = cache.lookup(engine.cache_key, prompt)
    assert hit is not None
    cache.request_started()
    cache.request_started()  # two overlapping requests
    other = replace(hit.snapshot.state, tokens=(*hit.snapshot.tokens[:-1], -1))
    cache.publish(engine.cache_key, other)
    cache.l2.flush(timeout=0.3)
    assert len(cache.l2) == 2  # held back
    cache.request_finished()
    cache.l2.flush(timeout=0.8)
    assert len(cache.l2) == 2  # one request still runs
    cache.request_finished()
    cache.l2.flush()
    assert len(cache.l2) == 3
    # An engine request holds writes from its prefill to its last event, even when the
    # consumer stops after the first token.
    gen = engine.generate(GenerationRequest(tuple(prompt), 4))
    next(gen)
    assert not cache.l2._idle.is_set()
    gen.close()
    assert cache.l2._idle.is_set()
    cache.close()
