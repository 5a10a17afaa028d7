"""The engine worker: one thread owns the engine (MLX stays on it) and runs jobs in a continuous
batch: queued jobs are admitted in FIFO order at step boundaries while fewer than `max_batch`
run, each `Batcher.step` advances every running job, and a job leaves the batch the step it
ends (its slot is free at once, also when its client disconnects).

HTTP handlers never touch the engine: they submit a `Job` and read its items in batches: the
worker appends to the job's buffer and wakes the event loop (`gateway/loop_wake.py`) only when
the reader is waiting, so items pushed while the loop is busy, or while a stream paces its
writes, cost no wake-up and are read together. The waiting queue is bounded; a full queue raises
`Overloaded` (429) with a Retry-After estimated from recent job durations.
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
from toolflash.engine.batching.api import Batcher, Outcome, batcher_for, default_max_batch
from toolflash.gateway.errors import ClientGone, NotReady, Overloaded
from toolflash.gateway.loop_wake import waker_for
from toolflash.policy.record import RecordedController
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
    decision_log: RecordedController | None = None  # the policy's controller, when there is one
    sampling_defaults: tuple[str, ...] = ()  # sampling fields taken from the model's defaults
    upstream: str | None = None  # the upstream replica serving it (None: the local engine)
    route: str = ""  # why that upstream pool (several pools of one model)


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
        # When the first token was handed over (the request's TTFT, whenever it is read).
        self.first_token_at: float | None = None
        self._loop = asyncio.get_running_loop()
        self._waker = waker_for(self._loop)
        self._loop_thread = threading.get_ident()  # an upstream's task pushes from the loop
        # Items cross threads through `_pushed` under `_lock`. `_waiter` is set while the
        # reader waits: for any item, or (`_waits_for_any` False: pacing its batches) only for
        # one that ends the job; the push it waits for wakes it. `_ended`: such an item was
        # pushed. `_taken` holds items the reader took but has not handed out yet.
        self._lock = threading.Lock()
        self._pushed: deque[tuple[str, Any]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._waits_for_any = True
        self._ended = False
        self._taken: list[tuple[str, Any]] = []

    def push(self, kind: str, payload: Any) -> None:
        """Hand an item to the event loop (from the worker thread, or from the loop itself: an
        upstream's relay task)."""
        ends = kind == "error" or isinstance(payload, FinishEvent)
        if (
            self.first_token_at is None
            and isinstance(payload, TokenEvent)
            and (payload.token_ids or payload.text)  # an upstream's events carry text only
        ):
            self.first_token_at = time.perf_counter()
        with self._lock:
            self._pushed.append((kind, payload))
            self._ended = self._ended or ends
            waiter = self._waiter
            if waiter is None or not (self._waits_for_any or ends):
                return  # the reader is busy or pacing: it takes this item with the others
            self._waiter = None
        if threading.get_ident() == self._loop_thread:
            # On the loop already: no cross-thread wake-up (its self-pipe write and the
            # extra loop iteration cost more than the token's own work).
            _wake(waiter)
            return
        if not self._waker.wake(waiter):  # the loop is closed: nobody is listening any more
            self.cancel.set()

    async def _take(self, not_before: float = 0.0) -> list[tuple[str, Any]]:
        """Every item pushed and not yet read (at least one: waits for it). Before
        `not_before` (a `time.perf_counter()` time; `math.inf`: until the end) it waits, unless
        the job has ended (its FinishEvent or an error is in), so events that come meanwhile
        are read together."""
        if self._taken:
            out, self._taken = self._taken, []
            return out
        pause = not_before - time.perf_counter()
        while True:
            with self._lock:
                pacing = pause > 0 and not self._ended
                if self._pushed and not pacing:
                    out = list(self._pushed)
                    self._pushed.clear()
                    return out
                waiter = self._waiter = self._loop.create_future()
                self._waits_for_any = not pacing
            timer = None
            if pacing and pause != math.inf:
                timer = self._loop.call_later(pause, _wake, waiter)
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
            pause = 0.0

    async def wait_prepared(self) -> Prepared:
        """Wait for the worker to tokenize the request; raises what preparation raised."""
        items = await self._take()
        (kind, payload), self._taken = items[0], items[1:]
        if kind == "error":
            raise payload
        assert kind == "prepared"
        return payload

    async def batches(self, min_interval_s: float = 0.0) -> AsyncIterator[list[EngineEvent]]:
        """Engine events up to and including the FinishEvent, in batches: each batch is every
        event that arrived since the previous one (at least one); raises an engine failure
        after the events before it.

        With `min_interval_s`, a batch is handed out at least that long after the previous one
        (not the first, nor one that ends the generation), so a stream writes at most one
        batch per interval however fast the engine goes; waiting costs no wake-up per event.
        `math.inf`: after the first batch, the rest comes in one batch when the job ends."""
        not_before = 0.0
        while True:
            items = await self._take(not_before)
            events: list[EngineEvent] = []
            for i, (kind, payload) in enumerate(items):
                if kind == "error":
                    self._taken = items[i:]  # raised on the next call, after these events
                    break
                events.append(payload)
                if isinstance(payload, FinishEvent):
                    yield events
                    return
            if not events:
                raise items[0][1]
            yield events
            not_before = time.perf_counter() + min_interval_s

    async def events(self) -> AsyncIterator[EngineEvent]:
        """Engine events one by one, up to and including the FinishEvent."""
        async for batch in self.batches():
            for event in batch:
                yield event


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # the reader may have been cancelled meanwhile
        waiter.set_result(None)


@dataclass
class EngineCall:
    """A plain function to run on the engine thread, in queue order (benchmarks, warm-ups)."""

    fn: Callable[[Engine], Any]
    future: concurrent.futures.Future[Any]


class EngineWorker:
    """Loads the engine on its own thread, then runs up to `max_batch` jobs at once, admitted
    first in first out; the rest wait in a queue of at most `max_queue`.

    The queue bound counts live waiting jobs only: a job whose client left while it waited is
    dropped at once (so it neither holds a slot nor runs). An `EngineCall` runs alone: it waits
    at the head of the queue until the running jobs have finished.
    """

    def __init__(
        self,
        factory: Callable[[], Engine],
        *,
        max_queue: int,
        max_batch: int | None = None,
        memory_limit: int | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        prefill_thread: bool | None = None,
    ) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        max_batch = default_max_batch() if max_batch is None else max_batch
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._factory = factory
        self._on_failure = on_failure
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.memory_limit = memory_limit  # bytes for the batch's caches (None: the machine's)
        self.prefill_thread = prefill_thread  # None: the batcher's own rule
        self._queue: deque[Job | EngineCall] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="toolflash-engine", daemon=True)
        self.state: WorkerState = "loading"
        self.engine: Engine | None = None
        self.load_error: BaseException | None = None
        self.active: list[Job] = []  # admitted and not finished, oldest first
        self._mean_job_s = 1.0  # running estimate for Retry-After
        self.ready = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the running jobs (which are cancelled); queued jobs are dropped."""
        with self._cond:
            self._stopping = True
            dropped = list(self._queue)
            self._queue.clear()
            for job in list(self.active):
                job.cancel.set()
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
        """Jobs in the running batch (prefilling or decoding)."""
        return len(self.active)

    @property
    def current(self) -> Job | None:
        """The oldest running job."""
        active = list(self.active)
        return active[0] if active else None

    def retry_after_s(self) -> int:
        # Jobs ahead leave max_batch at a time.
        rounds = math.ceil((self.waiting + 1) / self.max_batch)
        return max(1, min(120, math.ceil(self._mean_job_s * rounds)))

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

    def _next(self, batcher: Batcher) -> tuple[list[Job], EngineCall | None] | None:
        """Jobs to admit now (while the batch has room) or an engine call to run (once the
        batch is empty); waits while there is nothing to run. None: stop."""
        with self._cond:
            while True:
                self._purge_cancelled()
                if self._stopping:
                    return None
                jobs: list[Job] = []
                while self._queue and batcher.size + len(jobs) < self.max_batch:
                    head = self._queue[0]
                    if isinstance(head, EngineCall):
                        if batcher.size == 0 and not jobs:
                            return [], self._queue.popleft()  # type: ignore[return-value]
                        break
                    jobs.append(head)
                    self._queue.popleft()
                if jobs or batcher.size:
                    return jobs, None
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
        engine = self.engine
        batcher = batcher_for(engine, self.max_batch, self.memory_limit, self.prefill_thread)
        self.max_batch = min(self.max_batch, batcher.capacity)
        self.state = "ready"
        self.ready.set()
        log.info(
            "engine_ready", model=engine.model_id, draft=engine.draft_id, max_batch=self.max_batch
        )
        while (work := self._next(batcher)) is not None:
            jobs, call = work
            if call is not None:
                if call.future.set_running_or_notify_cancel():
                    try:
                        call.future.set_result(call.fn(engine))
                    except Exception as exc:
                        call.future.set_exception(exc)
                continue
            for i, job in enumerate(jobs):
                if not self._admit(engine, batcher, job):
                    with self._cond:  # no room yet: these wait at the head, in order
                        self._queue.extendleft(reversed(jobs[i:]))
                    break
            self._step(batcher)
        # Stopping: the running jobs were cancelled; each ends at its next step.
        while batcher.size:
            self._step(batcher)

    def _admit(self, engine: Engine, batcher: Batcher, job: Job) -> bool:
        """Prepare `job` (once) and add it to the batch; False when the batch's memory has no
        room for it until running jobs finish (it keeps its place at the head of the queue)."""
        if job.prepared is None:
            job.started_at = time.perf_counter()
            try:
                job.prepared = job.prepare(engine)
            except Exception as exc:
                job.push("error", exc)
                return True
            job.mode = job.prepared.request.mode
            job.push("prepared", job.prepared)
        request = job.prepared.request
        admission = batcher.admission(request)
        if admission == "wait" and batcher.size > 0:
            return False
        if admission == "never":
            retry = self.retry_after_s()
            job.push(
                "error",
                Overloaded(
                    f"the request needs more cache memory ({len(request.prompt_tokens)} prompt"
                    f" + {request.max_tokens} output tokens) than the server's batch budget;"
                    " lower max_tokens or shorten the prompt",
                    headers={"Retry-After": str(retry)},
                ),
            )
            return True
        try:
            batcher.add(job, request, job.cancel, job.prepared.decision_log)
        except Exception as exc:
            job.push("error", exc)
            return True
        self.active.append(job)
        return True

    def _step(self, batcher: Batcher) -> None:
        for key, outcome in batcher.step():
            assert isinstance(key, Job)
            self._deliver(key, outcome)

    def _deliver(self, job: Job, outcome: Outcome) -> None:
        if isinstance(outcome, BaseException):
            log.error("engine_generate_failed", id=job.id, error=repr(outcome))
            job.push("error", outcome)
            self._retire(job)
            return
        for event in outcome:
            if isinstance(event, TokenEvent):
                job.tokens += len(event.token_ids)
                if event.cycle is not None:
                    job.mode = event.cycle.mode
            job.push("event", event)
            if isinstance(event, FinishEvent):
                self._retire(job)

    def _retire(self, job: Job) -> None:
        if job in self.active:
            self.active.remove(job)
        if job.started_at is not None:
            took = time.perf_counter() - job.started_at
            self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * took
