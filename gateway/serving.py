"""What every API route shares before a request is understood: the app context (process state
built in the lifespan), body reading and JSON parsing, model lookup and request ids."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request

from toolflash.engine.api import Engine
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.errors import BadRequest, ModelNotFound, NotReady, PayloadTooLarge
from toolflash.gateway.limits import check_json_tree
from toolflash.gateway.metrics import GatewayMetrics
from toolflash.gateway.prepare import ControllerFactory, SparsePolicy
from toolflash.gateway.status import LiveStatus
from toolflash.gateway.worker import EngineWorker, Job

if TYPE_CHECKING:  # httpx is imported only where upstreams are configured
    from toolflash.gateway.upstream_run import UpstreamPools, UpstreamRoute

T = TypeVar("T")


@dataclass
class GatewayContext:
    """Process state built in the lifespan and reached through `request.state.gateway`."""

    config: GatewayConfig
    worker: EngineWorker
    metrics: GatewayMetrics
    status: LiveStatus
    # The adaptive policy: a mode controller per request (None: the engine runs request.mode).
    controller_factory: ControllerFactory | None = None
    # The policy files' sparse-prefill keep ratio per request class (None: not consulted).
    sparse_policy: SparsePolicy | None = None
    # Parses, validates, renders and tokenizes requests off the event loop and off the
    # engine thread (`offload`); built in the lifespan.
    renderer: ThreadPoolExecutor | None = None
    # Models served by upstream pools (`--upstreams`), and whether a local engine serves too.
    upstreams: UpstreamPools | None = None
    local: bool = True
    # Set on a request's own context when its model is an upstream pool's (`for_model`).
    upstream: UpstreamRoute | None = None
    # Why the local engine, loaded, can serve no more (None: it can), for /health: a
    # distributed target that lost a rank.
    engine_failure: Callable[[], str | None] | None = None

    async def offload(self, fn: Callable[[], T]) -> T:
        """`fn()` on a render thread within `render_timeout_s`. Past it the client gets a 400
        at once; the thread finishes the work it cannot be interrupted in, and its result
        is dropped (what it renders is bounded by the body limit and the checks before).
        The pool it holds is replaced by a fresh one, so later requests do not queue behind
        it (the old pool's threads end with their work)."""
        if self.renderer is None:
            return fn()
        pool = self.renderer
        future = asyncio.get_running_loop().run_in_executor(pool, fn)
        try:
            return await asyncio.wait_for(future, self.config.render_timeout_s)
        except TimeoutError:
            if self.renderer is pool:
                self.renderer = render_pool(self.config)
                pool.shutdown(wait=False)
            raise BadRequest(
                f"preparing the prompt took more than {self.config.render_timeout_s:g} s "
                "(chat template, schema or tokenizer); send less",
                code="prompt_too_slow",
            ) from None

    def for_model(self, requested: Any) -> GatewayContext:
        """The context a request for `requested` runs in: an upstream pool's model (or, with no
        local engine, the first pool's for a request naming none) gets its pool's."""
        if self.upstreams is None:
            return self
        routes = self.upstreams.routes
        route = routes.get(requested) if isinstance(requested, str) else None
        if route is None and requested is None and not self.local:
            route = next(iter(routes.values()))
        return self if route is None else replace(self, upstream=route)

    def engine(self) -> Engine:
        if self.upstream is not None:
            return self.upstream.engine
        if not self.local:
            raise ModelNotFound(
                "this server has no local model; it serves: "
                + ", ".join(self.upstreams.models if self.upstreams else ()),
                param="model",
            )
        engine = self.worker.engine
        if engine is None or self.worker.state != "ready":
            raise NotReady(f"the model is {self.worker.state}", headers={"Retry-After": "5"})
        return engine

    def model_names(self) -> list[str]:
        if self.upstream is not None:
            return [self.upstream.model]
        names = []
        if self.local:
            engine = self.engine()
            names = [engine.model_id, *self.config.served_model_names]
        if self.upstreams is not None:
            names += self.upstreams.models
        return list(dict.fromkeys(names))

    def resolve_model(self, requested: str | None) -> str:
        """The served model id for a request's `model`; 404 for anything else."""
        names = self.model_names()
        if requested is None or requested in names:
            return names[0]
        raise ModelNotFound(
            f"The model '{requested}' does not exist; this server serves: {', '.join(names)}",
            param="model",
        )


def render_pool(config: GatewayConfig) -> ThreadPoolExecutor:
    """The threads that parse, render and tokenize requests (`GatewayContext.offload`)."""
    return ThreadPoolExecutor(
        max_workers=config.render_threads, thread_name_prefix="toolflash-render"
    )


def gateway(request: Request) -> GatewayContext:
    ctx: GatewayContext = request.state.gateway
    return ctx


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; 413 past `limit` bytes (checked before and while reading, so an
    oversized body is refused without being held in memory)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body of {declared} bytes exceeds the limit of {limit} bytes"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The body parsed as a JSON object, no deeper than `max_depth` and with only strings
    UTF-8 can encode (run off the event loop: `GatewayContext.offload`)."""
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        raise BadRequest("request body is not UTF-8 JSON") from None
    except RecursionError:  # deeper than the parser's own stack allows
        raise BadRequest(f"the request body is nested more than {max_depth} levels deep") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    check_json_tree(body, max_depth)
    return body


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


async def watch_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client goes away (non-streaming requests)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return
