"""Logging: lines are rendered and written off the calling thread, in order, none lost."""

from __future__ import annotations

import io
import json
import threading

import pytest
import structlog

from toolflash.gateway.logs import LogWriter, configure_logging


@pytest.fixture(autouse=True)
def default_structlog():  # type: ignore[no-untyped-def]
    yield
    structlog.reset_defaults()


def test_json_lines_are_written_in_order_off_the_calling_thread() -> None:
    out = io.StringIO()
    writer = configure_logging(json_lines=True, level="info", stream=out)
    threads: list[str] = []
    render = writer.render
    writer.render = lambda *a: threads.append(threading.current_thread().name) or render(*a)  # type: ignore[method-assign]
    log = structlog.get_logger("test")
    for i in range(50):
        log.info("policy.decision", step=i, reason="because")
    log.debug("hidden")  # below the level: never queued
    writer.flush()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [d["step"] for d in lines] == list(range(50))
    assert lines[0]["event"] == "policy.decision" and lines[0]["level"] == "info"
    assert "timestamp" in lines[0]
    assert set(threads) == {"toolflash-logs"}


def test_exception_traceback_is_the_callers() -> None:
    out = io.StringIO()
    writer = configure_logging(json_lines=True, level="info", stream=out)
    try:
        raise ValueError("boom")
    except ValueError:
        structlog.get_logger("test").exception("failed")
    writer.flush()
    line = json.loads(out.getvalue().splitlines()[-1])
    assert "ValueError: boom" in line["exception"]


def test_full_queue_drops_and_counts_instead_of_blocking() -> None:
    gate = threading.Event()
    out = io.StringIO()

    def slow(_logger: object, _level: str, event: dict) -> str:  # type: ignore[type-arg]
        gate.wait(5)
        return json.dumps(event)

    writer = LogWriter(slow, out, max_lines=2)
    for i in range(10):
        writer.put({"event": "x", "i": i})
    assert writer.dropped >= 7
    gate.set()
    writer.close()
    assert 1 <= len(out.getvalue().splitlines()) <= 3


def test_a_line_that_fails_to_render_does_not_stop_the_writer() -> None:
    out = io.StringIO()

    def render(_logger: object, _level: str, event: dict) -> str:  # type: ignore[type-arg]
        if event["event"] == "bad":
            raise TypeError("cannot render")
        return json.dumps(event)

    writer = LogWriter(render, out)
    writer.put({"event": "bad"})
    writer.put({"event": "good"})
    writer.close()
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == ["good"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_lines_are_coloured_only_on_a_terminal() -> None:
    """A file, journald or a CI log gets plain text; a terminal gets colours."""
    for stream, coloured in ((io.StringIO(), False), (_Tty(), True)):
        writer = configure_logging(json_lines=False, level="info", stream=stream)
        structlog.get_logger("test").info("engine_ready", model="m")
        writer.flush()
        line = stream.getvalue()
        assert "engine_ready" in line and "model" in line
        assert ("\x1b[" in line) is coloured, repr(line)
