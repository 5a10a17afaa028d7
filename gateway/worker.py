"""The engine worker: one thread owns the engine (MLX stays on it) and serves jobs in FIFO order.

HTTP handlers never touch the engine: they submit a `Job` and read its items from an asyncio
queue the worker fills with `loop.call_soon_threadsafe`. The waiting queue is bounded; a full
queue raises `Overloaded` (429) with a Retry-After estimated from recent job durations.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from collections import deque
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
    sampling_defaults: tuple[str, ...] = ()  # sampling fields taken from the model's defaults


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
    """Loads the engine on its own thread, then serves jobs one at a time, first in first out.

    The queue bound counts live waiting jobs only: a job whose client left while it waited is
    dropped at once (so it neither holds a slot nor runs).
    """

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
        self._queue: deque[Job | EngineCall] = deque()
        self._cond = threading.Condition()
        self._stopping = False
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
        """Stop after the running job (which is cancelled); queued jobs are dropped."""
        with self._cond:
            self._stopping = True
            dropped = list(self._queue)
            self._queue.clear()
            if self.current is not None:
                self.current.cancel.set()
            self._cond.notify_all()
        for item in dropped:
            self._drop(item, "the server is shutting down")
        self._thread.join(timeout)
        self.state = "stopped"

    @property
    def waiting(self) -> int:
        """Queued jobs whose clients are still there."""
        return sum(1 for j in list(self._queue) if not (isinstance(j, Job) and j.cancel.is_set()))

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
        with self._cond:
            self._purge_cancelled()
            if len(self._queue) >= self.max_queue:
                retry = self.retry_after_s()
                raise Overloaded(
                    f"the server is busy: {len(self._queue)} requests are waiting (limit "
                    f"{self.max_queue}); retry in about {retry} s",
                    headers={"Retry-After": str(retry)},
                )
            self._queue.append(job)
            self._cond.notify()

    def call(self, fn: Callable[[Engine], Any]) -> concurrent.futures.Future[Any]:
        """Run `fn(engine)` on the engine thread after the jobs queued before it (not bounded
        by the queue limit: for benchmarks and warm-ups, not for request handlers)."""
        if self.state != "ready":
            raise NotReady(f"the model is {self.state}")
        item = EngineCall(fn, concurrent.futures.Future())
        with self._cond:
            self._queue.append(item)
            self._cond.notify()
        return item.future

    def _purge_cancelled(self) -> None:
        """Drop queued jobs whose clients left (caller holds the lock)."""
        gone = [j for j in self._queue if isinstance(j, Job) and j.cancel.is_set()]
        for job in gone:
            self._queue.remove(job)
            self._drop(job, "the client disconnected while queued")

    @staticmethod
    def _drop(item: Job | EngineCall, reason: str) -> None:
        if isinstance(item, Job):
            item.cancel.set()
            item.push("error", ClientGone(reason))
        else:
            item.future.cancel()

    def _next(self) -> Job | EngineCall | None:
        with self._cond:
            while True:
                self._purge_cancelled()
                if self._stopping:
                    return None
                if self._queue:
                    return self._queue.popleft()
                # Wake now and then to drop jobs cancelled while waiting.
                self._cond.wait(timeout=0.5)

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
        while (item := self._next()) is not None:
            if isinstance(item, EngineCall):
                if item.future.set_running_or_notify_cancel():
                    try:
                        item.future.set_result(item.fn(self.engine))
                    except Exception as exc:
                        item.future.set_exception(exc)
                continue
            self.current = item
            t0 = time.perf_counter()
            try:
                self._serve(self.engine, item)
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
