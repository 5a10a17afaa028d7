"""The Starlette app: routes, auth, error mapping and the lifespan that owns the engine worker."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from toolflash.engine.api import Engine
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.dialects.anthropic import count_tokens, create_message
from toolflash.gateway.dialects.anthropic import error_body as anthropic_error
from toolflash.gateway.dialects.chat import create_chat_completion
from toolflash.gateway.dialects.completions import create_completion
from toolflash.gateway.dialects.responses import create_response
from toolflash.gateway.errors import (
    ErrorShape,
    GatewayError,
    MethodNotAllowed,
    NotFound,
    Unauthorized,
    error_response,
    to_gateway_error,
)
from toolflash.gateway.metrics import GatewayMetrics, StatsCollector
from toolflash.gateway.openapi import openapi_document
from toolflash.gateway.prepare import ControllerFactory, SparsePolicy
from toolflash.gateway.protocol import ModelCard, ModelList
from toolflash.gateway.serving import GatewayContext, gateway, render_pool
from toolflash.gateway.status import LiveStatus
from toolflash.gateway.thread_priority import (
    loop_nice_for,
    lower_this_thread,
    mlx_on_cpu,
    usable_cores,
)
from toolflash.gateway.upstream_config import UpstreamsFile
from toolflash.gateway.worker import EngineWorker

log = structlog.get_logger("toolflash.gateway")

# Routes that answer without an API key: liveness probes and the schema.
PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})

Handler = Callable[[Request], Awaitable[Response]]


def api_route(handler: Handler, shape: ErrorShape | None = None) -> Handler:
    """Map every exception of an API handler to its dialect's error shape (OpenAI's unless
    `shape` says otherwise), in one place."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            err = to_gateway_error(exc)
            if not err.recorded:
                ctx: GatewayContext | None = getattr(request.state, "gateway", None)
                if ctx is not None:
                    ctx.metrics.rejected.labels(str(err.status)).inc()
                log.info(
                    "request",
                    path=request.url.path,
                    status=err.status,
                    outcome="rejected",
                    error=err.message,
                )
            return error_response(err, shape)

    return wrapped


def _card(ctx: GatewayContext, name: str) -> ModelCard:
    engine = ctx.for_model(name).engine()  # an upstream pool's model has its pool's
    return ModelCard(
        id=name,
        created=int(ctx.status.started_at),
        context_length=engine.context_length,
        draft=engine.draft_id,
    )


async def list_models(request: Request) -> Response:
    ctx = gateway(request)
    cards = [_card(ctx, name) for name in ctx.model_names()]
    return JSONResponse(ModelList(data=cards).model_dump(mode="json"))


async def retrieve_model(request: Request) -> Response:
    ctx = gateway(request)
    name = request.path_params["model"]
    if name not in ctx.model_names():
        ctx.resolve_model(name)  # raises the 404
    return JSONResponse(_card(ctx, name).model_dump(mode="json"))


async def health(request: Request) -> Response:
    ctx = gateway(request)
    worker = ctx.worker
    body: dict[str, Any] = {"status": worker.state if ctx.local else "ready"}
    if worker.load_error is not None:
        body["error"] = str(worker.load_error)
    lost = ctx.engine_failure() if ctx.local and ctx.engine_failure is not None else None
    if lost is not None and body["status"] == "ready":
        body["status"], body["error"] = "failed", lost
    if ctx.upstreams is not None:
        # A pool with no healthy replica is reported; the server stays up for the others.
        body["upstreams"] = {m: r.healthy() for m, r in ctx.upstreams.routes.items()}
        if not ctx.local and not any(body["upstreams"].values()):
            body["status"] = "unavailable"
    return JSONResponse(body, status_code=200 if body["status"] == "ready" else 503)


async def metrics(request: Request) -> Response:
    return Response(
        gateway(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


async def status(request: Request) -> Response:
    return JSONResponse(gateway(request).status.snapshot())


async def openapi(request: Request) -> Response:
    from toolflash import __version__

    return JSONResponse(openapi_document(__version__))


def error_shape(path: str) -> ErrorShape | None:
    """The error shape of the dialect a path belongs to (None: OpenAI's), also for errors no
    handler raised (auth, unknown routes and methods)."""
    return anthropic_error if path.startswith("/v1/messages") else None


class AuthMiddleware:
    """API-key check for everything except PUBLIC_PATHS, as `Authorization: Bearer <key>` (the
    OpenAI SDKs) or `x-api-key: <key>` (the Anthropic SDKs); pure ASGI: streams untouched."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.bearer = f"Bearer {api_key}".encode() if api_key else None
        self.key = api_key.encode() if api_key else b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.bearer is None or scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        bearer = hmac.compare_digest(headers.get(b"authorization", b""), self.bearer)
        keyed = hmac.compare_digest(headers.get(b"x-api-key", b""), self.key)
        if bearer or keyed:
            await self.app(scope, receive, send)
            return
        err = Unauthorized(
            "missing or invalid API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
        )
        err.headers["WWW-Authenticate"] = "Bearer"
        await error_response(err, error_shape(scope["path"]))(scope, receive, send)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    err: GatewayError
    if exc.status_code == 404:
        err = NotFound(f"no route for {request.method} {request.url.path}")
    elif exc.status_code == 405:
        err = MethodNotAllowed(f"method {request.method} is not allowed on {request.url.path}")
    else:
        err = GatewayError(str(exc.detail))
        err.status = exc.status_code
    return error_response(err, error_shape(request.url.path))


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(to_gateway_error(exc), error_shape(request.url.path))


def _no_engine() -> Engine:
    raise RuntimeError("no local model: this server serves only its upstream pools")


def create_app(
    engine_factory: Callable[[], Engine] | None,
    config: GatewayConfig | None = None,
    *,
    on_load_failure: Callable[[BaseException], None] | None = None,
    controller_factory: ControllerFactory | None = None,
    sparse_policy: SparsePolicy | None = None,
    policy_counters: Callable[[], dict[str, list[dict[str, Any]]]] | None = None,
    on_shutdown: Callable[[], None] | None = None,
    upstreams: UpstreamsFile | None = None,
    engine_failure: Callable[[], str | None] | None = None,
) -> Starlette:
    """The gateway app. The engine is built by `engine_factory` on the worker thread when the
    app starts; until it is ready /health answers 503 and API routes 503 with Retry-After.
    `controller_factory(ControllerRequest)` gives each request its mode controller (the
    adaptive policy); it runs on the engine thread, and its decisions are reported.
    `sparse_policy(model_id, request_class)` gives a class's sparse-prefill keep ratio from the
    policy files (None: the server's `sparse_prefill`). `upstreams`: models served by pools of
    OpenAI-compatible servers (`gateway/upstream_run.py`); with no `engine_factory` the server
    serves only those. `engine_failure()`: why the loaded engine can serve no more (None: it
    can); /health then answers 503 `failed` with it."""
    config = config or GatewayConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        worker = EngineWorker(
            engine_factory or _no_engine,
            max_queue=config.max_queue,
            max_batch=config.max_batch,
            memory_limit=config.batch_memory_bytes,
            prefill_thread={"auto": None, "on": True, "off": False}[config.prefill_thread],
            on_failure=on_load_failure,
        )
        ctx = GatewayContext(
            config=config,
            worker=worker,
            metrics=GatewayMetrics(lambda: worker.waiting, lambda: worker.running),
            status=LiveStatus(worker),
            controller_factory=controller_factory,
            sparse_policy=sparse_policy,
            renderer=render_pool(config),
            local=engine_factory is not None,
            engine_failure=engine_failure,
        )
        if upstreams is not None:
            from toolflash.gateway.upstream_run import UpstreamPools

            ctx.upstreams = UpstreamPools(upstreams)
            ctx.upstreams.start()
            ctx.metrics.add_collector(StatsCollector("upstream", labelled=ctx.upstreams.counters))
        app.state.gateway = ctx

        def cache_stats() -> dict[str, int]:
            cache = getattr(worker.engine, "prefix_cache", None)
            return cache.stats() if cache is not None else {}

        ctx.metrics.add_collector(StatsCollector("prefix_cache", flat=cache_stats))
        if policy_counters is not None:
            ctx.metrics.add_collector(StatsCollector("policy", labelled=policy_counters))
        t0 = time.perf_counter()
        if ctx.local:
            worker.start()  # its thread (and MLX's, made from it) keep the process's priority
            nice = loop_nice_for(config.loop_nice, mlx_on_cpu(), usable_cores())
            if lower_this_thread(nice):
                log.info("event_loop_priority_lowered", nice_steps=nice, setting=config.loop_nice)
        log.info(
            "gateway_starting",
            decoding="adaptive policy" if controller_factory is not None else config.mode,
            max_queue=config.max_queue,
            auth=bool(config.api_key),
        )
        try:
            yield {"gateway": ctx}
        finally:
            if ctx.upstreams is not None:
                await ctx.upstreams.close()
            if ctx.local:
                worker.stop()
            if ctx.renderer is not None:
                ctx.renderer.shutdown(wait=False, cancel_futures=True)
            # After the worker: no generation publishes any more, so what the prefix cache
            # queued for disk is written (bounded) before the process goes away. Off the
            # event loop, which may still be finishing other shutdown work.
            close = getattr(worker.engine, "close", None)
            if close is not None:
                await asyncio.to_thread(close)
            if on_shutdown is not None:
                on_shutdown()
            log.info("gateway_stopped", uptime_s=round(time.perf_counter() - t0, 1))

    routes = [
        Route("/v1/chat/completions", api_route(create_chat_completion), methods=["POST"]),
        Route("/v1/completions", api_route(create_completion), methods=["POST"]),
        Route("/v1/responses", api_route(create_response), methods=["POST"]),
        Route("/v1/messages", api_route(create_message, anthropic_error), methods=["POST"]),
        Route(
            "/v1/messages/count_tokens",
            api_route(count_tokens, anthropic_error),
            methods=["POST"],
        ),
        Route("/v1/models", api_route(list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", api_route(retrieve_model), methods=["GET"]),
        Route("/v1/status", api_route(status), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(AuthMiddleware, api_key=config.api_key)],
        exception_handlers={HTTPException: _http_exception, Exception: _server_error},
        lifespan=lifespan,
    )
