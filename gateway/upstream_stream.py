"""One upstream pool's side of a request: a replica's chat-completion stream fed into the
request's `Job` (`gateway/upstream_run.py` chooses the pool and the replica, and retries).

Until the upstream's first chunk arrives a failure (connect, 5xx, 429, timeout) raises `Retry`,
so the request moves to another replica; after it, a failure ends the stream with the dialect's
error event. The replica's slot is released in a `finally`, whatever ends the request: its end,
a client that leaves, a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import structlog

from toolflash.engine.api import FinishEvent, GenerationStats, TokenEvent
from toolflash.gateway.errors import ClientGone, GatewayError
from toolflash.gateway.upstream_choice import decode_speed
from toolflash.gateway.upstream_config import UpstreamPool
from toolflash.gateway.upstream_http import UpstreamClient, UpstreamNetError, UpstreamResponse
from toolflash.gateway.upstream_pool import Replica, failed, health_url, succeeded
from toolflash.gateway.upstream_wire import (
    ChunkText,
    MalformedEvent,
    SseEvents,
    error_text,
    finish,
)
from toolflash.gateway.worker import Job, Prepared

log = structlog.get_logger("toolflash.gateway.upstream")


# What a broken or slow connection raises (`gateway/upstream_http.py`, the gateway's own
# client: per token, httpcore's layers cost more than the rest of the relay).
TRANSPORT_ERRORS = (UpstreamNetError,)


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


class Retry(Exception):
    """A failure before the first chunk: try another replica."""


def _parse(events: SseEvents, data: bytes | None) -> list[dict[str, Any]] | None:
    """One read's events (None: the body ended); a malformed event is the upstream's failure."""
    try:
        if data is None:
            rest = events.close()
            return rest or None
        return events.feed(data)
    except MalformedEvent as exc:
        raise UpstreamFailed(f"the upstream sent a malformed event: {exc}") from None


async def _first_events(reads: AsyncIterator[bytes], events: SseEvents) -> list[dict[str, Any]]:
    """The events of the reads up to the first that completes one ([]: none before the end)."""
    while True:
        chunks = _parse(events, await anext(reads, None))
        if chunks is None or chunks:
            return chunks or []
        if events.done:
            return []


# How long the rest of a body after `[DONE]` may take (its chunked terminator comes at once).
DRAIN_TIMEOUT_S = 1.0


async def _drain(reads: AsyncIterator[bytes]) -> None:
    """Read a finished response's body to its end, so its connection goes back to the pool (a
    response left unread is closed, and the next request pays a TCP connect). A body that does
    not end within `DRAIN_TIMEOUT_S` is closed instead: the client has its answer already."""
    with contextlib.suppress(*TRANSPORT_ERRORS, TimeoutError):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in reads:
                pass


class PoolRoute:
    """One pool: its replicas and the requests it streams."""

    def __init__(self, pool: UpstreamPool, client: UpstreamClient) -> None:
        self.pool = pool
        self.name = pool.pool_name
        self.replicas = [Replica(u) for u in pool.urls]
        self._client = client
        key = pool.api_key()
        self._headers = [(b"content-type", b"application/json")]
        if key:
            self._headers.append((b"authorization", f"Bearer {key}".encode()))

    def healthy(self) -> bool:
        now = time.monotonic()
        return any(r.healthy and now >= r.open_until for r in self.replicas)

    def load(self, now: float, tried: set[str]) -> float | None:
        """Requests in flight per slot of the replicas that can take this request now (None:
        none can)."""
        free = [
            r for r in self.replicas if r.url not in tried and r.available(now, self.pool.capacity)
        ]
        if not free:
            return None
        return sum(r.in_flight for r in self.replicas) / (len(free) * self.pool.capacity)

    async def stream(
        self, job: Job, replica: Replica, body: dict[str, Any], prepared: Prepared
    ) -> float | None:
        """Stream the request from `replica` into `job`; its decode speed (tokens/s) when it
        ended well and long enough to say. Raises `Retry` before the first chunk."""
        pool, started = self.pool, time.perf_counter()
        replica.in_flight += 1
        replica.requests += 1
        first_at: float | None = None
        finished: GenerationStats | None = None
        text = ChunkText()
        events = SseEvents()
        data = json.dumps(body).encode()
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout(pool.first_byte_timeout_s):
                        response = await stack.enter_async_context(
                            self._client.stream(
                                "POST",
                                f"{replica.url}/chat/completions",
                                headers=self._headers,
                                content=data,
                                connect_timeout_s=pool.connect_timeout_s,
                                # The longest silence between two reads.
                                read_timeout_s=pool.idle_timeout_s,
                            )
                        )
                        if response.status >= 400:
                            await self._refused(response)
                        reads = aiter(response.aiter_stream())
                        first = await _first_events(reads, events)
                except (*TRANSPORT_ERRORS, TimeoutError, UpstreamFailed) as exc:
                    failed(replica, time.monotonic(), pool)
                    raise Retry(str(exc) or type(exc).__name__) from None
                if not first or (err := error_text(first[0])) is not None:
                    failed(replica, time.monotonic(), pool)
                    raise Retry(err if first else "the stream ended before its first chunk")
                first_at = time.perf_counter()
                # Committed to this replica: its first chunk is in.
                job.push("prepared", replace(prepared, upstream=replica.url))
                await self._relay(job, replica, first, reads, events, text)
                succeeded(replica)
                reason = finish(text.finish_reason)
                finished = self._finish(job, reason, text, started, first_at)
                await _drain(reads)
        except Retry:
            raise
        except asyncio.CancelledError:
            # The client left or asked no more: end the job like a cancelled generation.
            if first_at is None:
                job.push("error", ClientGone("the client went away before the first chunk"))
            elif finished is None:
                self._finish(job, "cancelled", text, started, first_at)
            raise
        except (*TRANSPORT_ERRORS, UpstreamFailed) as exc:
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
        finally:
            replica.in_flight -= 1
        if finished is None:
            return None
        return decode_speed(finished.completion_tokens, finished.decode_s)

    async def _refused(self, response: UpstreamResponse) -> None:
        """A refused request: the upstream's 4xx goes to the client, 429 and 5xx retry."""
        raw = await response.aread()
        try:
            message = error_text(json.loads(raw)) or raw.decode(errors="replace")
        except (json.JSONDecodeError, AttributeError):
            message = raw.decode(errors="replace")
        if response.status == 429 or response.status >= 500:
            raise UpstreamFailed(f"HTTP {response.status}: {message[:300]}")
        raise UpstreamRejected(response.status, f"the upstream refused: {message[:1000]}")

    async def _relay(
        self,
        job: Job,
        replica: Replica,
        first: list[dict[str, Any]],
        reads: AsyncIterator[bytes],
        events: SseEvents,
        text: ChunkText,
    ) -> None:
        """Chunks -> TokenEvents, one per network read with text, pushed as they come (no
        buffering; the reader paces its writes), up to `[DONE]` or the body's end. A silence
        longer than `idle_timeout_s` is the client's read timeout (`read_timeout_s`)."""
        chunks: list[dict[str, Any]] | None = first
        while chunks is not None:
            piece = ""
            for chunk in chunks:
                err = error_text(chunk)
                if err is not None:
                    raise UpstreamFailed(f"upstream {replica.url} failed mid-stream: {err}")
                piece += text.feed(chunk)
            if piece:
                job.tokens += 1
                job.push("event", TokenEvent((), piece))
            if events.done:
                break
            chunks = _parse(events, await anext(reads, None))
        tail = text.close()
        if tail:
            job.push("event", TokenEvent((), tail))

    def _finish(
        self, job: Job, reason: Any, text: ChunkText, started: float, first_at: float | None
    ) -> GenerationStats:
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
        return stats

    async def check_health(self) -> None:
        """One round of health checks, every replica at once."""

        async def one(replica: Replica) -> None:
            try:
                t = self.pool.connect_timeout_s
                status, _ = await self._client.request(
                    "GET",
                    health_url(replica.url, self.pool.health_path),
                    headers=self._headers[1:],
                    timeout_s=t,
                )
                healthy = status == 200
            except TRANSPORT_ERRORS:
                healthy = False
            if healthy != replica.healthy:
                log.info("upstream_health", upstream=replica.url, healthy=healthy)
            replica.healthy = healthy

        await asyncio.gather(*(one(r) for r in self.replicas))
