"""The app's lifespan shutdown closes the engine: the prefix cache's queued disk writes land
before the process goes, and a stalled disk cannot hang shutdown past the cache's bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from starlette.testclient import TestClient

from tests.gateway.fake_engine import FakeEngine
from toolflash.gateway.app import create_app

pytest.importorskip("mlx.core")

CHAT = {"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 4}


def ready(client: TestClient) -> TestClient:
    """Wait for the engine to load (it loads on the worker thread after startup)."""
    assert client.app.state.gateway.worker.ready.wait(60)  # type: ignore[attr-defined]
    return client


class ClosingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_shutdown_closes_the_engine_before_on_shutdown() -> None:
    engine = ClosingEngine()
    order: list[str] = []
    app = create_app(lambda: engine, on_shutdown=lambda: order.append(f"closed={engine.closed}"))
    with TestClient(app) as client:
        assert ready(client).post("/v1/chat/completions", json=CHAT).status_code == 200
        assert engine.closed == 0
    assert engine.closed == 1 and order == ["closed=1"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.engine.model_dirs import write_draft, write_qwen3_target

    root = tmp_path_factory.mktemp("shutdown-models")
    config = write_qwen3_target(root / "target")
    write_draft(root / "draft", config)
    return root / "target", root / "draft"


def engine_factory(
    dirs: tuple[Path, Path], l2: Path, write: Callable[[Any, Any], None], timeout_s: float
) -> Callable[[], Any]:
    """A real engine whose disk tier writes through `write(real_write, snapshot)`."""

    def build() -> Any:
        from toolflash.cache.prefix_cache import CacheConfig, PrefixCache
        from toolflash.engine.factory import build_engine

        engine = build_engine(str(dirs[0]), str(dirs[1]))
        cache = PrefixCache(CacheConfig(l2_dir=str(l2), l2_close_timeout_s=timeout_s))
        assert cache.l2 is not None
        real_write = cache.l2._write
        cache.l2._write = lambda snapshot: write(real_write, snapshot)
        engine.prefix_cache = cache
        return engine

    return build


def test_shutdown_flushes_queued_snapshots(model_dirs: Any, tmp_path: Path) -> None:
    def slow(real_write: Any, snapshot: Any) -> None:  # a slow disk: still queued at exit
        time.sleep(0.4)
        real_write(snapshot)

    app = create_app(engine_factory(model_dirs, tmp_path, slow, timeout_s=10))
    with TestClient(app) as client:
        r = ready(client).post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200
        assert not list(tmp_path.glob("*.json"))  # nothing written yet
    # Stable prefix + end of request, both on disk once the app has shut down.
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_a_stalled_disk_does_not_hang_shutdown(model_dirs: Any, tmp_path: Path) -> None:
    release = threading.Event()

    def stalled(real_write: Any, snapshot: Any) -> None:
        release.wait(30)

    app = create_app(engine_factory(model_dirs, tmp_path, stalled, timeout_s=0.3))
    client = TestClient(app).__enter__()
    try:
        assert ready(client).post("/v1/chat/completions", json=CHAT).status_code == 200
        with structlog.testing.capture_logs() as logs:
            t0 = time.monotonic()
            client.__exit__(None, None, None)  # the lifespan's shutdown
            elapsed = time.monotonic() - t0
    finally:
        release.set()
    assert elapsed < 3
    [event] = [e for e in logs if e["event"] == "l2_close_timeout"]
    assert event["dropped"] == 1 and event["write_in_progress"] is True
