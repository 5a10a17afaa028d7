"""`loop_nice`: the event loop thread runs at a lower CPU priority than the engine's thread
(Linux: nice is per thread); 0 leaves every thread as it was."""

from __future__ import annotations

import os
import sys
import threading

import httpx
import pytest

from tests.gateway.conftest import serve
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.thread_priority import AUTO_LOOP_NICE, loop_nice_for, lower_this_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")


def nice_of(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return os.getpriority(os.PRIO_PROCESS, thread.native_id)


def engine_thread() -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == "toolflash-engine")


def loop_nice(server: object) -> int:
    """The nice value of the serving event loop's thread (read on that thread)."""
    seen: dict[str, int] = {}

    def probe() -> None:  # runs on the loop's thread: the lifespan lowered it there
        seen["loop"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    server.servers[0].get_loop().call_soon_threadsafe(probe)  # type: ignore[attr-defined]
    for _ in range(200):
        if "loop" in seen:
            break
        threading.Event().wait(0.01)
    return seen["loop"]


@linux
@pytest.mark.parametrize("steps", [0, 3])
def test_the_loop_runs_steps_below_the_engine(steps: int) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    if base + 3 > 19:
        pytest.skip("already at the lowest priority")
    with serve(config=GatewayConfig(loop_nice=steps)) as s:
        r = httpx.post(
            f"{s.v1}/chat/completions",
            json={"messages": [{"role": "user", "content": "SCRIPT:hello"}], "stream": True},
            timeout=10,
        )
        assert r.status_code == 200
        assert nice_of(engine_thread()) == base
        loop = loop_nice(s.server)
    assert loop == base + steps
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # not the process


def test_nothing_changes_for_zero_steps_or_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not lower_this_thread(0)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not lower_this_thread(5)


def test_unset_lowers_the_loop_only_where_a_cpu_engine_fills_the_cores() -> None:
    assert loop_nice_for(None, engine_on_cpu=True, cores=2) == AUTO_LOOP_NICE
    assert loop_nice_for(None, engine_on_cpu=True, cores=1) == AUTO_LOOP_NICE
    assert loop_nice_for(None, engine_on_cpu=True, cores=4) == 0  # the loop has a core
    assert loop_nice_for(None, engine_on_cpu=False, cores=2) == 0  # a GPU engine
    assert loop_nice_for(0, engine_on_cpu=True, cores=2) == 0  # an explicit setting wins
    assert loop_nice_for(5, engine_on_cpu=False, cores=16) == 5


@linux
def test_unset_lowers_the_loop_on_a_two_core_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolflash.gateway import app as app_module

    monkeypatch.setattr(app_module, "usable_cores", lambda: 2)
    monkeypatch.setattr(app_module, "mlx_on_cpu", lambda: True)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    if base + AUTO_LOOP_NICE > 19:
        pytest.skip("already near the lowest priority")
    with serve(config=GatewayConfig()) as s:
        loop = loop_nice(s.server)
    assert loop == base + AUTO_LOOP_NICE
