"""What chat and text completions share: the app context, body reading, model lookup, job
submission with disconnect handling, and the per-request record (metrics, status, log line)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from starlette.requests import Request

from toolflash.engine.api import (
    ConstraintStats,
    ContextLengthError,
    CycleRecord,
    Engine,
    GenerationStats,
    ModeController,
    TokenLogprob,
)
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.errors import (
    BadRequest,
    GatewayError,
    ModelNotFound,
    NotReady,
    PayloadTooLarge,
    to_gateway_error,
)
from toolflash.gateway.limits import check_json_tree
from toolflash.gateway.metrics import GatewayMetrics, RequestOutcome
from toolflash.gateway.protocol import ConstraintInfo, Decision, Timings, ToolflashInfo
from toolflash.gateway.sampling import sampling_info
from toolflash.gateway.status import LiveStatus, RequestRecord
from toolflash.gateway.worker import EngineWorker, Job, Prepared
from toolflash.policy.record import RecordedController, recording
from toolflash.policy.request_class import RequestClass

log = structlog.get_logger("toolflash.gateway")

T = TypeVar("T")


@dataclass(frozen=True)
class ControllerRequest:
    """What a mode controller factory learns about a request (on the engine thread)."""

    model_id: str
    request_class: RequestClass
    response_format_json: bool
    start_in_reasoning: bool


# The adaptive policy's hook: a ModeController per request, or None for the server default.
ControllerFactory = Callable[[ControllerRequest], ModeController | None]


@dataclass
class GatewayContext:
    """Process state built in the lifespan and reached through `request.state.gateway`."""

    config: GatewayConfig
    worker: EngineWorker
    metrics: GatewayMetrics
    status: LiveStatus
    # The adaptive policy: a mode controller per request (None: the engine runs request.mode).
    controller_factory: ControllerFactory | None = None
    # Parses, validates, renders and tokenizes requests off the event loop and off the
    # engine thread (`offload`); built in the lifespan.
    renderer: ThreadPoolExecutor | None = None

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

    def engine(self) -> Engine:
        engine = self.worker.engine
        if engine is None or self.worker.state != "ready":
            raise NotReady(f"the model is {self.worker.state}", headers={"Retry-After": "5"})
        return engine

    def model_names(self) -> list[str]:
        engine = self.engine()
        names = [engine.model_id, *self.config.served_model_names]
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


def token_budget(
    prompt_len: int, requested: int | None, context_length: int, default_cap: int
) -> tuple[int, bool]:
    """(max_tokens, clamped): the requested output limit, or the remaining context capped at
    `default_cap` when none was requested; a request asking for more than fits is clamped to the
    remaining context (and says so) rather than refused, since agents send their configured
    output limit whatever the prompt length."""
    if prompt_len == 0:
        raise BadRequest("the prompt is empty", param="prompt")
    room = context_length - prompt_len
    if room < 1:
        raise ContextLengthError(prompt_len, requested or 0, context_length)
    if requested is None:
        return min(room, default_cap), False
    return min(requested, room), requested > room


def decision_log(
    factory: ControllerFactory | None,
    engine: Engine,
    request_class: RequestClass,
    *,
    start_in_reasoning: bool = False,
    response_format_json: bool = False,
) -> RecordedController | None:
    """The policy's controller for this request, keeping the decision records the response
    serves (a controller that keeps none is wrapped to record its changes of mode)."""
    if factory is None:
        return None
    controller = factory(
        ControllerRequest(engine.model_id, request_class, response_format_json, start_in_reasoning)
    )
    return recording(controller) if controller is not None else None


def constraint_info(c: ConstraintStats) -> ConstraintInfo:
    """The response's `toolflash.constraint` object."""
    return ConstraintInfo(
        mask_rows=c.mask_rows,
        mask_s=round(c.mask_s, 6),
        drafted_checked=c.drafted,
        grammar_rejected=c.grammar_rejected,
        grammar_cuts=c.grammar_cuts,
        forced_runs=c.forced_runs,
        forced_tokens=c.forced_tokens,
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


async def watch_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client goes away (non-streaming requests)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


@dataclass
class RequestRun:
    """Timing and outcome of one request, from arrival to its log line."""

    ctx: GatewayContext
    endpoint: str
    request_id: str
    model: str
    stream: bool
    ignored_fields: list[str]
    arrived: float = field(default_factory=time.perf_counter)
    job: Job | None = None
    prepared: Prepared | None = None
    first_token_at: float | None = None
    stats: GenerationStats | None = None
    finish_reason: str = ""
    outcome: str = "pending"
    recorded: bool = False
    tool_calls: tuple[str, ...] = ()  # per tool-call span: how it parsed (for metrics)
    # Log-probabilities of tokens received but not yet sent (when the request asked).
    logprobs: list[TokenLogprob] = field(default_factory=list)
    logprob_offset: int = 0  # completions: where the next token's text starts

    @property
    def wants_logprobs(self) -> bool:
        return self.prepared is not None and self.prepared.request.logprobs is not None

    def take_logprobs(self) -> list[TokenLogprob]:
        """The pending log-probabilities, handed out once."""
        out, self.logprobs = self.logprobs, []
        return out

    def submit(self, prepare: Callable[[Engine], Prepared]) -> Job:
        self.job = Job(self.request_id, prepare)
        self.ctx.worker.submit(self.job)
        return self.job

    async def wait_prepared(self) -> Prepared:
        """Wait for tokenization on the worker; raises what preparation raised, recorded."""
        assert self.job is not None
        try:
            self.prepared = await self.job.wait_prepared()
        except Exception as exc:
            raise self.fail(exc) from exc
        return self.prepared

    def fail(self, exc: BaseException) -> GatewayError:
        """Record a failure of this request and return the error to raise (once recorded, the
        route's error handler does not count or log it again)."""
        err = to_gateway_error(exc)
        self.outcome = "cancelled" if err.status == 499 else "error"
        self.record(status=err.status, error=err.message)
        err.recorded = True
        return err

    def token_seen(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    @property
    def request_class(self) -> str:
        return self.prepared.request_class.label if self.prepared else "unknown"

    @property
    def mode_label(self) -> str:
        if self.stats is not None and self.stats.modes:
            return "+".join(self.stats.modes)
        return self.prepared.request.mode if self.prepared else "none"

    def timings(self) -> Timings:
        now = time.perf_counter()
        job = self.job
        started = job.started_at if job and job.started_at else now
        s = self.stats
        return Timings(
            queue_s=round(started - self.arrived, 6),
            prefill_s=round(s.prefill_s, 6) if s else 0.0,
            decode_s=round(s.decode_s, 6) if s else 0.0,
            ttft_s=round(self.first_token_at - self.arrived, 6) if self.first_token_at else None,
            e2e_s=round(now - self.arrived, 6),
        )

    def info(self, extra: dict[str, Any] | None = None) -> ToolflashInfo:
        """The `toolflash` object: how this response was decoded."""
        assert self.prepared is not None
        s = self.stats
        req = self.prepared.request
        cycles = s.cycles if s else ()
        decisions = self.decisions(cycles)
        return ToolflashInfo(
            request_id=self.request_id,
            request_class=self.request_class,
            mode=self.mode_label,
            modes=list(s.modes) if s else [],
            cycles=len(cycles),
            spec_cycles=s.spec_cycles if s else 0,
            tokens_per_cycle=round(s.tokens_per_cycle, 4) if s else 0.0,
            drafted=s.drafted if s else 0,
            accepted=s.accepted if s else 0,
            decisions=decisions,
            sampling=sampling_info(req.sampling, self.prepared.sampling_defaults),
            max_tokens=req.max_tokens,
            max_tokens_clamped=self.prepared.max_tokens_clamped,
            decode_tokens_per_s=round(s.decode_tokens_per_s, 3) if s else 0.0,
            timings=self.timings(),
            ignored_fields=self.ignored_fields,
            constraint=constraint_info(s.constraint) if s and s.constraint else None,
            **(extra or {}),
        )

    def decisions(self, cycles: tuple[CycleRecord, ...]) -> list[Decision]:
        """The policy's logged decisions, or (without a policy) the server default and any
        mode change seen in the cycle records."""
        assert self.prepared is not None
        controller = self.prepared.decision_log
        if controller is not None and controller.records:
            return [
                Decision(
                    cycle=r.step,
                    mode=r.mode,
                    block_size=r.block_size,
                    reason=r.reason,
                    span=r.span,
                    kind=r.kind,
                )
                for r in controller.records
            ]
        req = self.prepared.request
        out = [Decision(cycle=0, mode=req.mode, block_size=req.block_size, reason="server default")]
        for prev, c in zip(cycles, cycles[1:], strict=False):
            if c.mode != prev.mode:
                out.append(Decision(cycle=c.index, mode=c.mode, reason="engine switched mode"))
        return out

    def record(self, *, status: int = 200, error: str | None = None) -> None:
        """Metrics, status ring and the one log line; idempotent."""
        if self.recorded:
            return
        self.recorded = True
        t = self.timings()
        s = self.stats
        if self.prepared is not None:
            self.ctx.metrics.record(
                RequestOutcome(
                    model=self.model,
                    request_class=self.request_class,
                    mode=self.mode_label,
                    outcome=self.outcome,
                    finish_reason=self.finish_reason or "none",
                    stats=s,
                    queue_s=t.queue_s,
                    ttft_s=t.ttft_s,
                    e2e_s=t.e2e_s,
                    tool_calls=self.tool_calls,
                )
            )
            self.ctx.status.add(
                RequestRecord(
                    id=self.request_id,
                    endpoint=self.endpoint,
                    request_class=self.request_class,
                    mode=self.mode_label,
                    outcome=self.outcome,
                    finish_reason=self.finish_reason,
                    prompt_tokens=s.prompt_tokens
                    if s
                    else len(self.prepared.request.prompt_tokens),
                    cached_tokens=s.cached_tokens if s else 0,
                    completion_tokens=s.completion_tokens if s else 0,
                    cycles=len(s.cycles) if s else 0,
                    tokens_per_cycle=round(s.tokens_per_cycle, 4) if s else 0.0,
                    drafted=s.drafted if s else 0,
                    accepted=s.accepted if s else 0,
                    queue_s=t.queue_s,
                    ttft_s=t.ttft_s,
                    decode_tokens_per_s=round(s.decode_tokens_per_s, 3) if s else 0.0,
                    e2e_s=t.e2e_s,
                    finished_at=time.time(),
                )
            )
        log.info(
            "request",
            id=self.request_id,
            endpoint=self.endpoint,
            stream=self.stream,
            request_class=self.request_class,
            mode=self.mode_label,
            status=status,
            outcome=self.outcome,
            finish_reason=self.finish_reason or None,
            prompt_tokens=s.prompt_tokens if s else None,
            cached_tokens=s.cached_tokens if s else None,
            completion_tokens=s.completion_tokens if s else None,
            cycles=len(s.cycles) if s else None,
            tokens_per_cycle=round(s.tokens_per_cycle, 3) if s else None,
            queue_s=t.queue_s,
            ttft_s=t.ttft_s,
            e2e_s=t.e2e_s,
            decode_tok_s=round(s.decode_tokens_per_s, 2) if s else None,
            ignored_fields=self.ignored_fields or None,
            error=error,
        )
