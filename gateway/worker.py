"""The engine worker: one thread owns the engine (MLX stays on it) and serves jobs in FIFO order.

HTTP handlers never touch the engine: they submit a `Job` and read its items from an asyncio
queue the worker fills with `loop.call_soon_threadsafe`. The waiting queue is bounded; a full
queue raises `Overloaded` (429) with a Retry-After estimated from recent job durations.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from toolflash.engine.api import Engine, EngineEvent, FinishEvent, GenerationRequest, TokenEvent
from toolflash.gateway.decisions import DecisionLog
from toolflash.gateway.errors import ClientGone, NotReady, Overloaded
from toolflash.policy.request_class import RequestClass

log = structlog.get_logger(__name__)

WorkerState = Literal["loading", "ready", "failed", "stopped"]


@dataclass(frozen=True)
class Prepared:
    """A request tokenized and checked on the worker, ready to generate."""

    request: GenerationRequest
    request_class: RequestClass
    start_in_reasoning: bool = False
    max_tokens_clamped: bool = False
    decision_log: DecisionLog | None = None  # wraps the policy's controller, when there is one


class Job:
    """One request's trip through the worker. Created on the event loop, run on the worker."""

    def __init__(self, job_id: str, prepare: Callable[[Engine], Prepared]) -> None:
        self.id = job_id
        self.prepare = prepare
        self.cancel = threading.Event()
        self.submitted_at = time.perf_counter()
        self.started_at: float | None = None
        self.prepared: Prepared | None = None
        # Live progress, written by the worker thread and read by /v1/status.
        self.tokens = 0
        self.mode = ""
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def push(self, kind: str, payload: Any) -> None:
        """Hand an item to the event loop (called from the worker thread)."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancel.set()

    async def wait_prepared(self) -> Prepared:
        """Wait for the worker to tokenize the request; raises what preparation raised."""
        kind, payload = await self._items.get()
        if kind == "error":
            raise payload
        assert kind == "prepared"
        return payload

    async def events(self) -> AsyncIterator[EngineEvent]:
        """Engine events up to and including the FinishEvent; raises an engine failure."""
        while True:
            kind, payload = await self._items.get()
            if kind == "error":
                raise payload
            yield payload
            if isinstance(payload, FinishEvent):
                return


@dataclass
class EngineCall:
    """A plain function to run on the engine thread, in queue order (benchmarks, warm-ups)."""

    fn: Callable[[Engine], Any]
    future: concurrent.futures.Future[Any]


class EngineWorker:
    """Loads the engine on its own thread, then serves jobs one at a time."""

    def __init__(
        self,
        factory: Callable[[], Engine],
        *,
        max_queue: int,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self._factory = factory
        self._on_failure = on_failure
        self.max_queue = max_queue
        self._queue: queue.Queue[Job | EngineCall | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="toolflash-engine", daemon=True)
        self.state: WorkerState = "loading"
        self.engine: Engine | None = None
        self.load_error: BaseException | None = None
        self.current: Job | None = None
        self._mean_job_s = 1.0  # running estimate for Retry-After
        self.ready = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the running job; queued jobs are cancelled."""
        if self.current is not None:
            self.current.cancel.set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, Job):
                job.cancel.set()
                job.push("error", ClientGone("the server is shutting down"))
            elif isinstance(job, EngineCall):
                job.future.cancel()
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self.state = "stopped"

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    @property
    def running(self) -> int:
        return 1 if self.current is not None else 0

    def retry_after_s(self) -> int:
        return max(1, min(120, math.ceil(self._mean_job_s * (self.waiting + 1))))

    def submit(self, job: Job) -> None:
        """Queue a job; raises NotReady while loading and Overloaded when the queue is full."""
        if self.state != "ready":
            detail = f": {self.load_error}" if self.load_error else ""
            raise NotReady(f"the model is {self.state}{detail}", headers={"Retry-After": "5"})
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            retry = self.retry_after_s()
            raise Overloaded(
                f"the server is busy: {self.waiting} requests are waiting (limit "
                f"{self.max_queue}); retry in about {retry} s",
                headers={"Retry-After": str(retry)},
            ) from None

    def call(self, fn: Callable[[Engine], Any]) -> concurrent.futures.Future[Any]:
        """Run `fn(engine)` on the engine thread after the jobs queued before it (blocks while
        the queue is full; not for request handlers, which must not block)."""
        if self.state != "ready":
            raise NotReady(f"the model is {self.state}")
        item = EngineCall(fn, concurrent.futures.Future())
        self._queue.put(item)
        return item.future

    def _run(self) -> None:
        try:
            self.engine = self._factory()
        except BaseException as exc:  # report any load failure, including SystemExit from libs
            self.load_error = exc
            self.state = "failed"
            log.error("engine_load_failed", error=repr(exc))
            if self._on_failure is not None:
                self._on_failure(exc)
            return
        self.state = "ready"
        self.ready.set()
        log.info("engine_ready", model=self.engine.model_id, draft=self.engine.draft_id)
        while True:
            job = self._queue.get()
            if job is None:
                return
            if isinstance(job, EngineCall):
                if job.future.set_running_or_notify_cancel():
                    try:
                        job.future.set_result(job.fn(self.engine))
                    except Exception as exc:
                        job.future.set_exception(exc)
                continue
            if job.cancel.is_set():  # the client left while queued
                job.push("error", ClientGone("the client disconnected while queued"))
                continue
            self.current = job
            t0 = time.perf_counter()
            try:
                self._serve(self.engine, job)
            finally:
                self.current = None
                self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (time.perf_counter() - t0)

    def _serve(self, engine: Engine, job: Job) -> None:
        job.started_at = time.perf_counter()
        try:
            prepared = job.prepare(engine)
        except Exception as exc:
            job.push("error", exc)
            return
        job.prepared = prepared
        job.mode = prepared.request.mode
        job.push("prepared", prepared)
        try:
            events = (
                engine.generate(prepared.request, job.cancel)
                if prepared.decision_log is None
                else engine.generate(prepared.request, job.cancel, prepared.decision_log)
            )
            for event in events:
                if isinstance(event, TokenEvent):
                    job.tokens += len(event.token_ids)
                    if event.cycle is not None:
                        job.mode = event.cycle.mode
                job.push("event", event)
        except Exception as exc:
            log.error("engine_generate_failed", id=job.id, error=repr(exc))
            job.push("error", exc)
