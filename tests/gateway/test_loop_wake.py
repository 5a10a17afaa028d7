"""The engine thread's wake-ups of readers on the event loop (`gateway/loop_wake.py`): none lost
however the wakes and the loop's reads interleave, one byte per wake-up the loop has not taken
yet, and a job's events read in order, once each, through it."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

from toolflash.engine.api import FinishEvent, GenerationStats, TokenEvent
from toolflash.gateway import loop_wake
from toolflash.gateway.loop_wake import LoopWaker, waker_for
from toolflash.gateway.worker import Job, Prepared

LOOPS = pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop])


def _run(new_loop: Callable[[], asyncio.AbstractEventLoop], main: Any) -> Any:
    loop = new_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@LOOPS
def test_no_wake_is_lost_from_racing_threads(new_loop: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        waker = waker_for(loop)
        waiters = [loop.create_future() for _ in range(4000)]

        def wake(part: list[asyncio.Future[None]], seed: int) -> None:
            rng = random.Random(seed)
            for w in part:
                assert waker.wake(w)
                if rng.random() < 0.05:
                    time.sleep(0)  # let the loop run between some of them

        threads = [threading.Thread(target=wake, args=(waiters[i::4], i)) for i in range(4)]
        for t in threads:
            t.start()
        await asyncio.wait_for(asyncio.gather(*waiters), 10)
        for t in threads:
            t.join()

    _run(new_loop, main)


@LOOPS
def test_wakes_due_while_the_loop_is_busy_write_one_byte(
    new_loop: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    real_write = loop_wake.os.write

    def counted(fd: int, data: bytes) -> int:
        writes.append(fd)
        return real_write(fd, data)

    monkeypatch.setattr(loop_wake.os, "write", counted)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waker = waker_for(loop)
        waiters = [loop.create_future() for _ in range(5)]
        woken = threading.Thread(target=lambda: [waker.wake(w) for w in waiters])
        woken.start()
        woken.join()  # the loop did not run meanwhile: all five are due at once
        assert len(writes) == 1
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        again = loop.create_future()
        threading.Thread(target=waker.wake, args=(again,)).start()
        await asyncio.wait_for(again, 5)  # once the loop took them, a wake writes again
        assert len(writes) == 2

    _run(new_loop, main)


@LOOPS
def test_a_cancelled_reader_is_skipped(new_loop: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        waker = waker_for(loop)
        gone, waiting = loop.create_future(), loop.create_future()
        gone.cancel()
        woken = threading.Thread(target=lambda: (waker.wake(gone), waker.wake(waiting)))
        woken.start()
        await asyncio.wait_for(waiting, 5)
        woken.join()

    _run(new_loop, main)


def test_a_closed_loop_is_not_woken() -> None:
    loop = asyncio.new_event_loop()
    waker = LoopWaker(loop)
    waiter = loop.create_future()
    loop.close()
    assert not waker.wake(waiter)


def test_a_push_after_the_loop_closed_cancels_the_job() -> None:
    loop = asyncio.new_event_loop()

    async def make() -> tuple[Job, Any]:
        job = Job("job", lambda engine: Prepared(None, None))  # type: ignore[arg-type]
        reading = asyncio.ensure_future(job._take())
        await asyncio.sleep(0)  # the reader waits
        return job, reading

    job, reading = loop.run_until_complete(make())
    reading.cancel()
    loop.close()
    pusher = threading.Thread(target=job.push, args=("event", TokenEvent((1,), "a")))
    pusher.start()
    pusher.join()
    assert job.cancel.is_set()


@LOOPS
def test_a_jobs_events_arrive_in_order_once_each(new_loop: Any) -> None:
    # The engine thread pushes at random pace while the reader is sometimes slow: batches of
    # one or many, never a token lost, repeated or out of order.
    tokens = [TokenEvent((i,), str(i)) for i in range(3000)]
    finish = FinishEvent("length", GenerationStats(0, len(tokens), 0, 0.0, 0.0, ()))

    async def main() -> list[Any]:
        job = Job("job", lambda engine: Prepared(None, None))  # type: ignore[arg-type]

        def engine() -> None:
            rng = random.Random(7)
            for t in tokens:
                job.push("event", t)
                if rng.random() < 0.1:
                    time.sleep(rng.random() * 1e-4)
            job.push("event", finish)

        thread = threading.Thread(target=engine)
        thread.start()
        rng = random.Random(11)
        read: list[Any] = []
        async for batch in job.batches():
            read += batch
            if rng.random() < 0.1:
                time.sleep(2e-4)  # a busy loop: the engine's pushes pile up meanwhile
        thread.join()
        return read

    assert _run(new_loop, main) == [*tokens, finish]


@LOOPS
def test_a_loops_pipe_is_closed_with_it(new_loop: Any) -> None:
    def fds() -> int:
        return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0

    if not fds():
        pytest.skip("no /proc/self/fd to count open files")
    gc.collect()
    before = fds()
    for _ in range(20):
        loop = new_loop()
        waker_for(loop)
        loop.close()
        del loop
    gc.collect()
    assert fds() <= before + 2  # not two pipe ends per loop
