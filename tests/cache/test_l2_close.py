"""Closing the disk tier: queued writes reach the disk, close is idempotent and bounded, puts
after it are no-ops, and a process that never closes still exits cleanly with its writes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
import structlog

from toolflash.cache.key import SnapshotKey
from toolflash.cache.l2 import DiskCache
from toolflash.cache.prefix_cache import CacheConfig, PrefixCache
from toolflash.cache.snapshot import Snapshot
from toolflash.cache.state import LayerState, SessionState

KEY = SnapshotKey("t", None, (), None, None, "h", "float32")


def snapshot(n: int) -> Snapshot:
    """A small dense state covering tokens 0..n-1."""
    kv = mx.arange(n * 8, dtype=mx.float32).reshape(1, 1, n, 8)
    state = SessionState(tuple(range(n)), (LayerState("kv", (kv, kv + 1)),), None, mx.zeros((16,)))
    return Snapshot(key=KEY, state=state)


def on_disk(directory: Path) -> int:
    return len(list(directory.glob("*.json")))


def test_queued_writes_are_on_disk_after_close(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path)
    cache.pause()  # as during a prefill: nothing is written yet, all of it is queued
    for n in (2, 3, 4):
        assert cache.put(snapshot(n))
    assert on_disk(tmp_path) == 0
    t0 = time.monotonic()
    cache.close()
    assert time.monotonic() - t0 < 5  # close does not wait out the prefill defer (30 s)
    assert on_disk(tmp_path) == 3 and cache.stats["writes"] == 3
    assert not cache._writer.is_alive()
    reopened = DiskCache(tmp_path)
    hit = reopened.lookup(KEY, list(range(10)))
    assert hit is not None and hit.tokens == (0, 1, 2, 3)
    reopened.close()


def test_close_twice_and_put_after_close(tmp_path: Path) -> None:
    cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path)))
    assert cache.l2 is not None
    cache.l2.put(snapshot(2))
    cache.close()
    cache.close()  # idempotent
    assert cache.l2.closed and not cache.l2._writer.is_alive()
    assert cache.l2.put(snapshot(3)) is False
    cache.publish(KEY, snapshot(4).state)  # still fills L1, never the disk
    time.sleep(0.1)
    assert on_disk(tmp_path) == 1 and cache.l2.stats["writes"] == 1
    assert cache.l1.lookup(KEY, tuple(range(4))) is not None


def test_a_slow_write_does_not_hang_close(tmp_path: Path) -> None:
    """The bound is hit: close returns, says what it dropped, and the writer drops the rest
    once its current write ends instead of writing it."""
    cache = DiskCache(tmp_path)
    started, release = threading.Event(), threading.Event()
    real_write = cache._write

    def slow_write(item: Snapshot) -> None:  # a disk that stalls
        started.set()
        release.wait(30)
        real_write(item)

    cache._write = slow_write
    for n in (2, 3, 4):
        assert cache.put(snapshot(n))
    assert started.wait(5)
    with structlog.testing.capture_logs() as logs:
        t0 = time.monotonic()
        cache.close(timeout=0.3)
        elapsed = time.monotonic() - t0
    assert elapsed < 2
    [event] = [e for e in logs if e["event"] == "l2_close_timeout"]
    assert event["dropped"] == 2 and event["write_in_progress"] is True
    release.set()
    cache._writer.join(5)
    assert not cache._writer.is_alive()
    assert cache.stats["writes"] == 1 and cache.stats["dropped_at_close"] == 2
    assert on_disk(tmp_path) == 1


def test_a_full_queue_behind_a_stalled_write_does_not_hang_close(tmp_path: Path) -> None:
    """No room even for the stop marker: close still returns within its bound."""
    cache = DiskCache(tmp_path)
    release = threading.Event()

    def stalled(item: Snapshot) -> None:
        release.wait(30)

    cache._write = stalled
    sent = 0
    while cache.put(snapshot(2 + sent % 4)):
        sent += 1
    t0 = time.monotonic()
    cache.close(timeout=0.3)
    assert time.monotonic() - t0 < 2
    release.set()
    cache._writer.join(5)
    assert not cache._writer.is_alive()
    assert cache.stats["dropped_at_close"] == sent - 1  # all but the one that was being written


@pytest.mark.parametrize("close", [False, True])
def test_a_script_that_exits_mid_write_keeps_its_writes(tmp_path: Path, close: bool) -> None:
    """Without close() (and with it), the process exits cleanly and the queued writes are on
    disk: the disk tier closes itself at interpreter exit."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.cache.test_l2_close import snapshot
        from toolflash.cache.l2 import DiskCache
        cache = DiskCache({str(tmp_path)!r})
        for n in range(2, 10):
            cache.put(snapshot(n * 64))
        if {close!r}:
            cache.close()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "terminate called" not in proc.stderr
    assert on_disk(tmp_path) == 8


def test_engine_close_flushes_the_disk_tier(tmp_path: Path, model_dirs_qwen3: Any) -> None:
    from toolflash.engine.api import GenerationRequest
    from toolflash.engine.factory import build_engine

    engine = build_engine(*map(str, model_dirs_qwen3))
    cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path)))
    engine.prefix_cache = cache
    assert cache.l2 is not None
    prompt = engine.encode_chat([{"role": "user", "content": "def add(a, b):"}])
    list(engine.generate(GenerationRequest(tuple(prompt), 4)))
    # Whether the writer got to it yet is a race (the engine resumes writes after its
    # prefill); queued-write flushing is pinned by the DiskCache tests above.
    assert cache.counters["published"] == 1
    engine.close()
    engine.close()
    assert on_disk(tmp_path) == 1 and cache.l2.closed


@pytest.fixture(scope="module")
def model_dirs_qwen3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from ..engine.model_dirs import write_draft, write_qwen3_target

    root = tmp_path_factory.mktemp("qwen3")
    config = write_qwen3_target(root / "target")
    write_draft(root / "draft", config)
    return root / "target", root / "draft"


def test_checksum_of_a_running_write_yields_to_a_prefill(tmp_path: Path) -> None:
    """A write already hashing when the engine starts a prefill waits between blocks until the
    prefill ends (the gate is set again), then finishes with the same checksum."""
    import hashlib

    import numpy as np

    from toolflash.cache.l2 import _sha256

    data = tmp_path / "blob"
    data.write_bytes(np.random.default_rng(0).bytes(3 << 20))
    gate = threading.Event()  # cleared: a prefill is running
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(_sha256(data, gate, 30.0)))
    worker.start()
    worker.join(0.3)
    assert worker.is_alive() and not result  # held at the first block
    gate.set()
    worker.join(5.0)
    assert result == [hashlib.sha256(data.read_bytes()).hexdigest()]
    # The wait is bounded: with the gate never set it still finishes after max_wait_s.
    assert _sha256(data, threading.Event(), 0.05) == result[0]


def test_writes_wait_for_a_quiet_gap_after_a_prefill(tmp_path: Path) -> None:
    """A write starts only once the engine has been out of prefill for `_QUIET_S`: a next
    request arriving right after the last one finds no write in progress. Closing skips it."""
    from toolflash.cache.l2 import _QUIET_S

    l2 = DiskCache(tmp_path)
    l2.pause()
    l2.resume()
    t0 = time.monotonic()
    l2._wait_quiet(5.0)
    assert time.monotonic() - t0 >= _QUIET_S * 0.9
    t0 = time.monotonic()
    l2._wait_quiet(5.0)  # already quiet long enough: no wait
    assert time.monotonic() - t0 < _QUIET_S / 2
    l2.pause()
    l2.close()
    t0 = time.monotonic()
    l2._wait_quiet(5.0)
    assert time.monotonic() - t0 < _QUIET_S / 2
