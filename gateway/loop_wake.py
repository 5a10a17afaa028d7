"""Waking readers that wait on an event loop from other threads: one pipe per loop, and a byte
written only when the loop has taken the previous one.

The engine thread hands every streamed token to a reader waiting on the loop. With
`loop.call_soon_threadsafe` its wake-up write runs with the GIL held, so the loop thread, woken
while the engine still holds the GIL, goes back to sleep on the GIL and is woken again when the
engine lets go: ~2.8 loop wake-ups per streamed token (the embedded qwen35 pair, AR, scheduler
counts). `os.write` lets go of the GIL while the kernel wakes the loop, which then takes the GIL
at once: ~1.1 wake-ups per token. And one byte wakes the loop for every waiter due until it runs
(the streams of one batched step), where asyncio's `call_soon_threadsafe` writes once per call.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref

_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWaker] = (
    weakref.WeakKeyDictionary()
)
_wakers_lock = threading.Lock()


def waker_for(loop: asyncio.AbstractEventLoop) -> LoopWaker:
    """The loop's waker (made on first use; call it on the loop's thread the first time)."""
    with _wakers_lock:
        waker = _wakers.get(loop)
        if waker is None:
            waker = _wakers[loop] = LoopWaker(loop)
        return waker


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class LoopWaker:
    """Sets waiters' results on the loop's thread, woken through a pipe the loop reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # the loop holds this waker (its reader), not the reverse
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        # Closed with the waker (its loop is gone), not at exit under a loop still running.
        weakref.finalize(self, _close, self._read_fd, self._write_fd).atexit = False
        self._lock = threading.Lock()
        # Waiters to wake; non-empty means a byte is in the pipe or about to be written.
        self._due: list[asyncio.Future[None]] = []
        loop.add_reader(self._read_fd, self._run)

    def wake(self, waiter: asyncio.Future[None]) -> bool:
        """Have the loop set `waiter`'s result (from any thread but the loop's); False when
        the loop is closed (nobody will read it)."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            return False
        with self._lock:
            self._due.append(waiter)
            if len(self._due) > 1:
                return True  # the byte written for the first one wakes the loop for this one
        try:
            os.write(self._write_fd, b"\0")
        except BlockingIOError:  # the pipe is full of unread bytes: the loop is waking anyway
            pass
        return True

    def _run(self) -> None:
        # Read the bytes before taking the waiters: a waiter whose byte this read consumed was
        # added before it, so it is taken below; a later one writes a byte of its own.
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            due, self._due = self._due, []
        for waiter in due:
            if not waiter.done():  # its reader may have been cancelled meanwhile
                waiter.set_result(None)
