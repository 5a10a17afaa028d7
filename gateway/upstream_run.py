"""Requests for a model served by an upstream pool: a `Job` fed by an asyncio task that streams
the upstream's chat completion, so the shared reader, record and dialects serve it as they
serve the local engine's jobs.

The task chooses a replica (least loaded, `upstream_pool.pick`), and until the upstream's first
chunk arrives a failure (connect, 5xx, 429, timeout) moves the request to another replica; after
it, a failure ends the stream with the dialect's error event. Each replica's slot is released in
a `finally`, whatever ends the request: its end, a client that leaves, a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import httpcore
import structlog

from toolflash.engine.api import (
    Engine,
    FinishEvent,
    GenerationRequest,
    GenerationStats,
    SamplingParams,
    TokenEvent,
)
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.errors import ClientGone, GatewayError
from toolflash.gateway.prepare import request_class
from toolflash.gateway.prompt import Prompt
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.upstream_config import UpstreamPool, UpstreamsFile
from toolflash.gateway.upstream_engine import UpstreamEngine
from toolflash.gateway.upstream_pool import Replica, failed, health_url, pick, succeeded
from toolflash.gateway.upstream_wire import ChunkText, chat_body, finish
from toolflash.gateway.worker import Job, Prepared

log = structlog.get_logger("toolflash.gateway.upstream")


# What a broken or slow connection raises (httpx's client layers cost ~1 ms a request on
# a loaded 2-core machine: the gateway talks to upstreams through httpcore's pool directly).
TRANSPORT_ERRORS = (httpcore.NetworkError, httpcore.TimeoutException, httpcore.ProtocolError)


class UpstreamUnavailable(GatewayError):
    """No replica could take the request (all failed, open, unhealthy or full)."""

    status = 503
    type = "server_error"
    code = "upstream_unavailable"


class UpstreamFailed(GatewayError):
    """The upstream broke off a response already streaming."""

    status = 502
    type = "server_error"
    code = "upstream_error"


class UpstreamRejected(GatewayError):
    """The upstream refused the request itself (its 4xx, passed on: not a replica failure)."""

    type = "invalid_request_error"
    code = "upstream_rejected"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Retry(Exception):
    """A failure before the first chunk: try another replica."""


class _CancelEvent(threading.Event):
    """The job's cancel flag; setting it (client gone, one call done) also stops the task."""

    def __init__(self, on_set: Callable[[], None]) -> None:
        super().__init__()
        self._on_set = on_set

    def set(self) -> None:
        super().set()
        self._on_set()


def upstream_preparer(req: ApiRequest, config: GatewayConfig, request_id: str) -> Any:
    """The request's budget, class and sampling as the record reports them (no prompt tokens
    here: the upstream tokenizes; its usage fills the counts at the end)."""

    def prepare(engine: Engine) -> Prepared:
        requested = req.max_tokens
        cap = min(config.default_max_tokens, engine.context_length)
        max_tokens = min(requested, engine.context_length) if requested else cap
        s = req.sampling
        sampling = SamplingParams(
            temperature=s.temperature or 0.0,
            top_p=s.top_p if s.top_p is not None else 1.0,
            top_k=s.top_k or 0,
            min_p=s.min_p or 0.0,
            seed=s.seed,
            frequency_penalty=s.frequency_penalty or 0.0,
            presence_penalty=s.presence_penalty or 0.0,
        )
        klass = request_class(req, Prompt(()), sampled=not sampling.greedy)
        request = GenerationRequest(
            prompt_tokens=(),
            max_tokens=max_tokens,
            mode="ar",
            stop_strings=req.stop,
            sampling=sampling,
            request_id=request_id,
        )
        return Prepared(request, klass, max_tokens_clamped=bool(requested and requested > cap))

    return prepare


async def _lines(stream: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """A byte stream's lines, each yielded as soon as its newline arrives."""
    rest = b""
    async for chunk in stream:
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode()
    if rest:
        yield rest.decode()


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an SSE stream's `data:` lines, up to `[DONE]`."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            raise UpstreamFailed(f"the upstream sent a malformed event: {data[:200]!r}") from None
        if isinstance(obj, dict):
            yield obj


def _error_text(obj: dict[str, Any]) -> str | None:
    err = obj.get("error")
    if err is None:
        return None
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)


class UpstreamRoute:
    """One pool: its replicas, its engine view and the requests it streams."""

    def __init__(self, pool: UpstreamPool, client: httpcore.AsyncConnectionPool) -> None:
        self.pool = pool
        self.engine = UpstreamEngine(pool)
        self.replicas = [Replica(u) for u in pool.urls]
        self._client = client
        key = pool.api_key()
        self._headers = [(b"content-type", b"application/json")]
        if key:
            self._headers.append((b"authorization", f"Bearer {key}".encode()))
        idle, connect = pool.idle_timeout_s, pool.connect_timeout_s
        self._timeouts = {
            "timeout": {"connect": connect, "read": idle, "write": idle, "pool": idle}
        }
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    def healthy(self) -> bool:
        now = time.monotonic()
        return any(r.healthy and now >= r.open_until for r in self.replicas)

    def start(self, req: ApiRequest, job_id: str, config: GatewayConfig) -> Job:
        """A job whose events come from this pool (the task starts at once)."""
        job = Job(job_id, upstream_preparer(req, config, job_id))
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._run(job, req))

        def stop() -> None:
            loop.call_soon_threadsafe(task.cancel)

        job.cancel = _CancelEvent(stop)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(self, job: Job, req: ApiRequest) -> None:
        try:
            await self._route(job, req)
        except Exception as exc:  # a bug of ours: the client gets a 500, never a hung request
            log.error("upstream_task_failed", id=job.id, error=repr(exc))
            job.push("error", exc)

    async def _route(self, job: Job, req: ApiRequest) -> None:
        job.started_at = time.perf_counter()
        try:
            prepared = job.prepare(self.engine)
            body = chat_body(req, self.pool.sent_model, prepared.request.max_tokens)
        except Exception as exc:
            job.push("error", exc)
            return
        tried: set[str] = set()
        errors: list[str] = []
        while True:
            replica = pick(self.replicas, time.monotonic(), self.pool.capacity, tried)
            if replica is None:
                detail = "; ".join(errors) or "every replica is unhealthy, cooling down or full"
                job.push(
                    "error",
                    UpstreamUnavailable(
                        f"no upstream of pool {self.pool.model!r} could serve the request: {detail}",
                        headers={"Retry-After": "5"},
                    ),
                )
                return
            tried.add(replica.url)
            try:
                await self._stream(job, replica, body, prepared)
                return
            except _Retry as exc:
                errors.append(f"{replica.url}: {exc}")
                log.warning("upstream_retry", id=job.id, upstream=replica.url, error=str(exc))
            except asyncio.CancelledError:
                return

    async def _stream(
        self, job: Job, replica: Replica, body: dict[str, Any], prepared: Prepared
    ) -> None:
        pool, started = self.pool, time.perf_counter()
        replica.in_flight += 1
        replica.requests += 1
        first_at: float | None = None
        text = ChunkText()
        data = json.dumps(body).encode()
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout(pool.first_byte_timeout_s):
                        response = await stack.enter_async_context(
                            self._client.stream(
                                "POST",
                                f"{replica.url}/chat/completions",
                                # A length, not chunks: one write, no Nagle wait on the tail.
                                headers=[
                                    *self._headers,
                                    (b"content-length", str(len(data)).encode()),
                                ],
                                content=data,
                                extensions=self._timeouts,
                            )
                        )
                        if response.status >= 400:
                            await self._refused(response)
                        chunks = _sse_data(_lines(response.aiter_stream()))
                        first = await anext(chunks, None)
                except (*TRANSPORT_ERRORS, TimeoutError, UpstreamFailed) as exc:
                    failed(replica, time.monotonic(), pool)
                    raise _Retry(str(exc) or type(exc).__name__) from None
                if first is None or (err := _error_text(first)) is not None:
                    failed(replica, time.monotonic(), pool)
                    raise _Retry(err if first else "the stream ended before its first chunk")
                first_at = time.perf_counter()
                # Committed to this replica: its first chunk is in.
                job.push("prepared", replace(prepared, upstream=replica.url))
                await self._relay(job, replica, first, chunks, text)
        except _Retry:
            raise
        except asyncio.CancelledError:
            # The client left or asked no more: end the job like a cancelled generation.
            if first_at is None:
                job.push("error", ClientGone("the client went away before the first chunk"))
            else:
                self._finish(job, "cancelled", text, started, first_at)
            raise
        except (*TRANSPORT_ERRORS, UpstreamFailed, TimeoutError) as exc:
            failed(replica, time.monotonic(), pool)
            log.warning("upstream_broke", id=job.id, upstream=replica.url, error=repr(exc))
            job.push(
                "error",
                exc
                if isinstance(exc, UpstreamFailed)
                else UpstreamFailed(f"upstream {replica.url} broke off the response: {exc!r}"),
            )
        except GatewayError as exc:  # the upstream's own 4xx
            job.push("error", exc)
        else:
            succeeded(replica)
            self._finish(job, finish(text.finish_reason), text, started, first_at)
        finally:
            replica.in_flight -= 1

    async def _refused(self, response: httpcore.Response) -> None:
        """A refused request: the upstream's 4xx goes to the client, 429 and 5xx retry."""
        raw = await response.aread()
        try:
            message = _error_text(json.loads(raw)) or raw.decode(errors="replace")
        except (json.JSONDecodeError, AttributeError):
            message = raw.decode(errors="replace")
        if response.status == 429 or response.status >= 500:
            raise UpstreamFailed(f"HTTP {response.status}: {message[:300]}")
        raise UpstreamRejected(response.status, f"the upstream refused: {message[:1000]}")

    async def _relay(
        self,
        job: Job,
        replica: Replica,
        first: dict[str, Any],
        chunks: AsyncIterator[dict[str, Any]],
        text: ChunkText,
    ) -> None:
        """Chunks -> TokenEvents, one per chunk with text, pushed as they come (no buffering;
        the reader paces its writes). The idle timeout bounds each wait."""
        chunk: dict[str, Any] | None = first
        while chunk is not None:
            err = _error_text(chunk)
            if err is not None:
                raise UpstreamFailed(f"upstream {replica.url} failed mid-stream: {err}")
            piece = text.feed(chunk)
            if piece:
                job.tokens += 1
                job.push("event", TokenEvent((), piece))
            async with asyncio.timeout(self.pool.idle_timeout_s):
                chunk = await anext(chunks, None)
        tail = text.close()
        if tail:
            job.push("event", TokenEvent((), tail))

    def _finish(
        self, job: Job, reason: Any, text: ChunkText, started: float, first_at: float | None
    ) -> None:
        tail = text.close() if reason == "cancelled" else ""
        if tail:
            job.push("event", TokenEvent((), tail))
        now = time.perf_counter()
        usage = text.usage
        stats = GenerationStats(
            prompt_tokens=usage.prompt_tokens if usage else 0,
            cached_tokens=usage.cached_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            prefill_s=(first_at or now) - started,
            decode_s=now - (first_at or now),
            cycles=(),
        )
        job.push("event", FinishEvent(reason, stats))

    async def check_health(self) -> None:
        """One round of health checks, every replica at once."""

        async def one(replica: Replica) -> None:
            try:
                t = self.pool.connect_timeout_s
                response = await self._client.request(
                    "GET",
                    health_url(replica.url, self.pool.health_path),
                    headers=self._headers[1:],
                    extensions={"timeout": {"connect": t, "read": t, "write": t, "pool": t}},
                )
                healthy = response.status == 200
            except TRANSPORT_ERRORS:
                healthy = False
            if healthy != replica.healthy:
                log.info("upstream_health", upstream=replica.url, healthy=healthy)
            replica.healthy = healthy

        await asyncio.gather(*(one(r) for r in self.replicas))

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class UpstreamPools:
    """Every pool of an `--upstreams` file, by client model name, with their health checks."""

    def __init__(self, pools: UpstreamsFile) -> None:
        # One connection pool for all replicas; limits are the pools' capacities.
        self._client = httpcore.AsyncConnectionPool(
            max_connections=None, max_keepalive_connections=64
        )
        self.routes = {p.model: UpstreamRoute(p, self._client) for p in pools.pools}
        self._health: asyncio.Task[None] | None = None

    @property
    def models(self) -> list[str]:
        return list(self.routes)

    def start(self) -> None:
        self._health = asyncio.get_running_loop().create_task(self._health_loop())

    async def _health_loop(self) -> None:
        due = {name: 0.0 for name in self.routes}
        while True:
            now = time.monotonic()
            for name, route in self.routes.items():
                if now >= due[name]:
                    due[name] = now + route.pool.health_interval_s
                    await route.check_health()
            await asyncio.sleep(max(0.05, min(due.values()) - time.monotonic()))

    async def close(self) -> None:
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        for route in self.routes.values():
            await route.cancel_all()
        await self._client.aclose()

    def counters(self) -> dict[str, list[dict[str, Any]]]:
        """Per-replica gauges for /metrics (`toolflash:upstream_*{model, upstream}`)."""
        out: dict[str, list[dict[str, Any]]] = {
            "in_flight": [],
            "requests": [],
            "errors": [],
            "healthy": [],
            "circuit_open": [],
        }
        now = time.monotonic()
        for name, route in self.routes.items():
            for r in route.replicas:
                labels = {"model": name, "upstream": r.url}
                out["in_flight"].append({"labels": labels, "value": r.in_flight})
                out["requests"].append({"labels": labels, "value": r.requests})
                out["errors"].append({"labels": labels, "value": r.errors})
                out["healthy"].append({"labels": labels, "value": int(r.healthy)})
                out["circuit_open"].append({"labels": labels, "value": int(now < r.open_until)})
        return out
