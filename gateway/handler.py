"""The one request path every API route runs: body -> the dialect's wire type -> `ApiRequest` ->
rendered prompt -> worker job -> `EventReader` -> the dialect's response or stream.

A dialect (`gateway/dialects/`) supplies only what is its own: parsing its body, turning it into
the neutral request, building its complete response from the collected pieces, encoding stream
events, and the shape of its errors. Everything else (render threads, queueing, disconnects,
the reader, outcomes, the record, metrics and the log line) happens here, once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from toolflash.engine.api import Engine
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.errors import GatewayError, to_gateway_error
from toolflash.gateway.prepare import preparer
from toolflash.gateway.prompt import Prompt, render_prompt
from toolflash.gateway.reader import (
    Batch,
    Collected,
    Ending,
    EventReader,
    Output,
    answer_for,
    collect,
    output_for,
)
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.run import RequestRun
from toolflash.gateway.serving import (
    GatewayContext,
    gateway,
    new_id,
    parse_json,
    read_body,
    watch_disconnect,
)


@dataclass(frozen=True)
class Parsed:
    """A body its dialect validated: the wire object (the dialect's own type), the served
    model it names, whether it streams, and the fields it ignored."""

    wire: Any
    model: str
    stream: bool
    ignored_fields: list[str]


class StreamEncoder(Protocol):
    """A dialect's stream events for one response (each method returns the text to write)."""

    def start(self) -> str:
        """What goes out before the first delta ("" for nothing)."""
        ...

    def batch(self, batch: Batch) -> str: ...

    def end(self, ending: Ending) -> str:
        """The closing events (the end marker included)."""
        ...

    def error(self, err: GatewayError) -> str:
        """An error after the headers went out (the end marker included)."""
        ...


class Dialect(Protocol):
    """One API dialect on the shared request path."""

    api: str  # "chat", "completions", "messages", "responses": ids, metrics, logs
    id_prefix: str

    def parse(self, body: dict[str, Any], ctx: GatewayContext) -> Parsed:
        """Validate the body and resolve its model (on a render thread)."""
        ...

    def request(self, wire: Any) -> ApiRequest:
        """The neutral request (on a render thread, before the prompt renders)."""
        ...

    def response(self, run: RequestRun, parsed: Parsed, result: Collected) -> dict[str, Any]:
        """The complete (non-streaming) response body."""
        ...

    def encoder(self, run: RequestRun, parsed: Parsed) -> StreamEncoder: ...

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        """The dialect's error shape (the status stays the error's)."""
        ...


def _parse(dialect: Dialect, raw: bytes, ctx: GatewayContext) -> tuple[GatewayContext, Parsed]:
    """The body parsed by its dialect in the context of the model it names (an upstream
    pool's, or the local engine's)."""
    body = parse_json(raw, ctx.config.max_json_depth)
    ctx = ctx.for_model(body.get("model"))
    return ctx, dialect.parse(body, ctx)


def _render(dialect: Dialect, parsed: Parsed, engine: Engine) -> tuple[ApiRequest, Prompt]:
    req = dialect.request(parsed.wire)
    return req, render_prompt(req, engine)


async def handle(request: Request, dialect: Dialect) -> Response:
    """Serve one API request of `dialect`."""
    ctx = gateway(request)
    raw = await read_body(request, ctx.config.max_body_bytes)
    ctx, parsed = await ctx.offload(lambda: _parse(dialect, raw, ctx))
    engine = ctx.engine()
    run = RequestRun(
        ctx,
        dialect.api,
        new_id(dialect.id_prefix),
        parsed.model,
        parsed.stream,
        parsed.ignored_fields,
    )
    route = ctx.upstream
    try:
        if route is not None:
            # The upstream renders and tokenizes; the neutral request is a plain conversion of
            # the body parsed already, so no thread hop (its GIL handoff cost more).
            req = dialect.request(parsed.wire)
        else:
            req, prompt = await ctx.offload(lambda: _render(dialect, parsed, engine))
    except Exception as exc:
        raise run.fail(exc) from exc
    if route is not None:
        job = run.job = route.start(req, run.request_id, ctx.config)
    else:
        job = run.submit(
            preparer(
                req, prompt, ctx.config, run.request_id, ctx.controller_factory, ctx.sparse_policy
            )
        )
    watcher = asyncio.create_task(watch_disconnect(request, job))
    try:
        prepared = await run.wait_prepared()
        output = output_for(req, prepared, engine)
        run.reader = EventReader(
            job,
            output,
            answer_for(req, prepared),
            stops=req.stop,
            decode=engine.decode,
            read_interval_s=read_interval_s(parsed.stream, output, ctx.config),
        )
        if parsed.stream:
            watcher.cancel()  # StreamingResponse watches for the disconnect from here on
            return StreamingResponse(
                stream_response(run, dialect.encoder(run, parsed)),
                media_type="text/event-stream",
                headers={
                    "x-toolflash-mode": run.mode_label,
                    "x-request-id": run.request_id,
                    "cache-control": "no-cache",
                },
            )
        try:
            result = await collect(run.reader)
        except Exception as exc:
            raise run.fail(exc) from exc
        run.outcome = "cancelled" if result.ending.cancelled else "success"
        body = dialect.response(run, parsed, result)
        run.record()
        return JSONResponse(
            body, headers={"x-toolflash-mode": run.mode_label, "x-request-id": run.request_id}
        )
    finally:
        watcher.cancel()


def read_interval_s(stream: bool, output: Output, config: GatewayConfig) -> float:
    """How often the reader takes the engine's events: a stream as they come (or paced by
    `stream_interval_ms`); a complete response once at the end (every wake-up of the event
    loop costs the engine thread time), unless its output may stop the generation early."""
    if stream:
        return config.stream_interval_ms / 1e3
    return 0.0 if output.can_stop else math.inf


async def stream_response(run: RequestRun, encoder: StreamEncoder) -> AsyncIterator[str]:
    """The streaming skeleton: the dialect's events around the reader's batches; after the
    headers an error becomes the dialect's error event; the run is recorded however the
    stream ends (a client that goes away mid-stream cancels the generation)."""
    assert run.reader is not None
    status, error = 200, None
    try:
        try:
            head = encoder.start()
            if head:
                yield head
            # One write per batch of deltas: the events of its chunks go out together.
            async for batch in run.reader.batches():
                out = encoder.batch(batch)
                if out:
                    yield out
            ending = run.reader.ending
            assert ending is not None
            if ending.cancelled:
                run.outcome = "cancelled"
            end = encoder.end(ending)
            if run.outcome == "pending":
                run.outcome = "success"
        except Exception as exc:  # after headers: an error event, then the end marker
            err = to_gateway_error(exc)
            status, error, run.outcome = err.status, err.message, "error"
            end = encoder.error(err)
        yield end
    finally:
        if run.outcome == "pending":  # the client went away mid-stream
            run.outcome = "cancelled"
        if run.job is not None:
            run.job.cancel.set()
        run.record(status=status, error=error)
