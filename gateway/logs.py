"""structlog setup for the server: one JSON object per line on stderr (or console lines),
rendered and written by a background thread.

Policy decisions are logged from the engine thread between decode steps. Rendering a line there
(ISO timestamp, JSON or console formatting) and writing it cost 0.1-0.5 ms per line, on decode
steps of a few ms: a short agent request with three decisions paid ~1.5 ms. So the calling
thread only stamps the event (level, time, context, a formatted traceback) and queues it; a
daemon thread renders and writes the lines in order. `flush_logs()` drains the queue (it also
runs at exit). A full queue drops lines and counts them rather than block a decode step.
"""

from __future__ import annotations

import atexit
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog

Render = Callable[[Any, str, MutableMapping[str, Any]], str]
_STOP = object()


class LogWriter:
    """Renders queued event dicts and writes them to `stream` (None: whatever `sys.stderr` is
    when the line is written, so a redirection, e.g. `doctor` keeping its output to its report,
    covers lines already queued), on its own thread."""

    def __init__(self, render: Render, stream: TextIO | None, max_lines: int = 10_000) -> None:
        self.render = render
        self.stream = stream
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_lines)
        self._thread = threading.Thread(target=self._run, name="toolflash-logs", daemon=True)
        self._thread.start()

    def put(self, event_dict: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(event_dict)
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout: float = 2.0) -> None:
        """Wait (at most `timeout` seconds) until every queued line is written."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.001)

    def close(self, timeout: float = 2.0) -> None:
        """Write what is queued (within `timeout`), then stop the thread."""
        self.flush(timeout)
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                level = str(item.get("level", "info"))
                stream = self.stream or sys.stderr
                stream.write(self.render(None, level, item) + "\n")
                stream.flush()
            except Exception:  # a bad value or a closed stream must not stop later lines
                pass
            finally:
                self._queue.task_done()


class _QueueLogger:
    """The structlog logger: every level hands the processed event dict to the writer."""

    def __init__(self, writer: LogWriter) -> None:
        self._writer = writer

    def msg(self, **event_dict: Any) -> None:
        self._writer.put(event_dict)

    log = debug = info = warn = warning = msg
    error = err = critical = fatal = exception = failure = msg


def _as_kwargs(logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """Last synchronous processor: the event dict itself, handed to `_QueueLogger.msg`."""
    return dict(event_dict)


_writer: LogWriter | None = None


def configure_logging(
    *, json_lines: bool = True, level: str = "info", stream: TextIO | None = None
) -> LogWriter:
    """Configure structlog process-wide (called by `toolflash serve` and the CLI, never at
    import); lines go to `stream` (default: stderr, as it is when each line is written).
    Console lines carry ANSI colours only when the stream is a terminal (a file, journald or a
    CI log gets plain text). Returns the writer (tests flush it)."""
    global _writer
    renderer: Render = (
        structlog.processors.JSONRenderer()  # type: ignore[assignment]
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=is_terminal(stream or sys.stderr))
    )
    if _writer is not None:
        _writer.close()
    writer = _writer = LogWriter(renderer, stream)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # Here, not on the writer thread: the traceback is the caller's current exception.
            structlog.processors.format_exc_info,
            _as_kwargs,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=lambda *args: _QueueLogger(writer),
        cache_logger_on_first_use=True,
    )
    return writer


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is an interactive terminal (closed or odd streams are not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def flush_logs(timeout: float = 2.0) -> None:
    """Write every queued log line (at most `timeout` seconds)."""
    if _writer is not None:
        _writer.flush(timeout)


atexit.register(flush_logs)
