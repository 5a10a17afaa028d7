"""The batch scheduler's prefill thread: prompt chunks computed beside the decode steps give
the same tokens as each request alone, and a chunk in flight is cancelled, fails or publishes
its states like one computed on the scheduler's own thread."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

import pytest

from toolflash.engine.api import GenerationRequest
from toolflash.engine.batching.batcher import EngineBatcher, prefill_in_thread, queue_ahead_on
from toolflash.engine.lane import Lane
from toolflash.engine.session import GenerationSession

from .test_batching import Run, alone, drive, prompts, small_chunk_engine


@pytest.fixture(scope="module", params=["qwen3", "qwen35"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return small_chunk_engine(request.param, tmp_path_factory.mktemp(f"models_{request.param}"))


def long_prompts(engine: Any, n: int) -> list[tuple[int, ...]]:
    """Prompts of several 8-token chunks each (the fixture's prefill chunk)."""
    return [p * 4 for p in prompts(engine, n)]


def test_queue_ahead_and_prefill_thread_rules() -> None:
    assert queue_ahead_on("gpu") and not queue_ahead_on("cpu")
    assert prefill_in_thread("cpu", 4, pipeline=False)
    assert not prefill_in_thread("cpu", 2, pipeline=False)
    assert not prefill_in_thread("gpu", 16, pipeline=False)
    assert not prefill_in_thread("cpu", 16, pipeline=True)


def test_chunks_on_the_thread_give_the_tokens_alone(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests arriving while others decode, in spec and AR rows: their prompt chunks run on
    the prefill thread, and every sequence's tokens and text are those it produces alone."""
    threads: list[str] = []
    feed = GenerationSession.feed_chunk

    def recorded(self: GenerationSession, *args: Any, **kwargs: Any) -> None:
        threads.append(threading.current_thread().name)
        feed(self, *args, **kwargs)

    monkeypatch.setattr(GenerationSession, "feed_chunk", recorded)
    reqs = [
        GenerationRequest(p, 16 + 5 * i, mode="spec" if i % 2 == 0 else "ar", ignore_eos=True)
        for i, p in enumerate(long_prompts(engine, 4))
    ]
    arrivals: dict[int, list[tuple[Hashable, GenerationRequest]]] = {
        0: [(0, reqs[0])],
        3: [(1, reqs[1]), (2, reqs[2])],
        9: [(3, reqs[3])],
    }
    run = drive(EngineBatcher(engine, prefill_thread=True), arrivals)
    chunks = len(threads)
    assert not run.errors
    assert chunks >= 4 * 3 and all(name.startswith("toolflash-prefill") for name in threads)
    for i, req in enumerate(reqs):
        tokens, text, reason = alone(engine, req)
        assert run.tokens[i] == tokens, i
        assert run.text[i] == text
        assert run.finish[i].finish_reason == reason


def gated_feed(monkeypatch: pytest.MonkeyPatch, slow: set[int]) -> threading.Event:
    """Lanes whose prompt length is in `slow` wait in `feed_next` until the event is set."""
    gate = threading.Event()
    feed_next = Lane.feed_next

    def waiting(self: Lane, settle: bool = False) -> None:
        if len(self.prompt) in slow:
            assert gate.wait(30)
        feed_next(self, settle)

    monkeypatch.setattr(Lane, "feed_next", waiting)
    return gate


def test_cancel_while_its_chunk_is_on_the_thread(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request cancelled while its chunk computes ends (cancelled) once the chunk is done;
    the sequence decoding beside it goes on undisturbed, and the scheduler never waits."""
    ps = long_prompts(engine, 2)
    gate = gated_feed(monkeypatch, {len(ps[1])})
    running = GenerationRequest(ps[0], 24, mode="ar", ignore_eos=True)
    cancel = threading.Event()
    batcher = EngineBatcher(engine, prefill_thread=True)
    batcher.add(0, running)
    run = Run()
    while 0 not in run.tokens:
        run.take(batcher.step())
    batcher.add(1, GenerationRequest(ps[1], 24, mode="ar"), cancel)
    for _ in range(5):  # the chunk waits at the gate: decoding goes on
        run.take(batcher.step())
    cancel.set()
    run.take(batcher.step())
    assert 1 not in run.finish and len(run.tokens[0]) >= 6
    gate.set()
    while batcher.size:
        run.take(batcher.step())
    assert run.finish[1].finish_reason == "cancelled" and 1 not in run.tokens
    assert run.tokens[0] == alone(engine, running)[0]
    assert batcher.budget.used == 0


def test_a_failing_chunk_ends_only_its_request(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception on the prefill thread is that request's outcome; the others finish as
    alone, and a request after it prefills on the thread as usual."""
    ps = long_prompts(engine, 3)
    feed_next = Lane.feed_next

    def failing(self: Lane, settle: bool = False) -> None:
        if self.prompt == list(ps[1]):
            raise RuntimeError("chunk failed")
        feed_next(self, settle)

    monkeypatch.setattr(Lane, "feed_next", failing)
    reqs = [GenerationRequest(p, 20, mode="spec", ignore_eos=True) for p in ps]
    run = drive(
        EngineBatcher(engine, prefill_thread=True),
        {0: [(0, reqs[0]), (1, reqs[1])], 2: [(2, reqs[2])]},
    )
    assert isinstance(run.errors[1], RuntimeError) and 1 not in run.finish
    for i in (0, 2):
        assert run.tokens[i] == alone(engine, reqs[i])[0]


def test_states_published_from_the_thread_serve_later_requests(engine: Any) -> None:
    """A state the thread reached at `publish_at` is published and restored by a later
    request (whose remaining chunks run on the thread too) with the tokens of a cold run."""
    assert engine.prefix_cache is not None
    base = long_prompts(engine, 1)[0]
    extended = base + tuple(prompts(engine, 3)[2])
    first = GenerationRequest(base, 12, mode="spec", publish_at=(len(base) - 3,))
    second = GenerationRequest(extended, 12, mode="spec")
    cold = alone(engine, second)[0]
    batcher = EngineBatcher(engine, prefill_thread=True)
    drive(batcher, {0: [("first", first)]})
    hits = engine.prefix_cache.counters["hits_l1"]
    run = drive(batcher, {0: [("second", second)]})
    assert engine.prefix_cache.counters["hits_l1"] == hits + 1
    assert run.finish["second"].stats.cached_tokens == len(base) - 3
    assert run.tokens["second"] == cold


def test_a_failing_chunk_leaves_the_rows_queued_forward_alone(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer's chunk fails while two AR rows decode with their next forward queued
    ahead: only the newcomer fails, and the rows keep the tokens they get alone."""
    ps = long_prompts(engine, 3)
    feed_next = Lane.feed_next

    def failing(self: Lane, settle: bool = False) -> None:
        if self.prompt == list(ps[2]):
            raise RuntimeError("chunk failed")
        feed_next(self, settle)

    monkeypatch.setattr(Lane, "feed_next", failing)
    rows = [GenerationRequest(p, 40, mode="ar", ignore_eos=True) for p in ps[:2]]
    batcher = EngineBatcher(engine, prefill_thread=True, queue_ahead=True)
    for i, r in enumerate(rows):
        batcher.add(i, r)
    run = Run()
    while batcher.rows.size < 2:
        run.take(batcher.step())
    batcher.add(2, GenerationRequest(ps[2], 8, mode="ar"))
    while batcher.size:
        run.take(batcher.step())
    assert isinstance(run.errors[2], RuntimeError)
    for i, r in enumerate(rows):
        assert run.tokens[i] == alone(engine, r)[0], i
