"""One request's trip from arrival to its log line: job submission, failure recording, and the
`RequestRecord` that its response extension, metrics, /v1/status row and log line come from."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from toolflash.engine.api import Engine, GenerationStats
from toolflash.gateway.errors import GatewayError, to_gateway_error
from toolflash.gateway.protocol import Decision, Timings, ToolflashInfo
from toolflash.gateway.reader import EventReader
from toolflash.gateway.record import Prep, RequestRecord, log_fields, toolflash_info
from toolflash.gateway.sampling import sampling_info
from toolflash.gateway.serving import GatewayContext
from toolflash.gateway.worker import Job, Prepared

log = structlog.get_logger("toolflash.gateway")


def decisions(prepared: Prepared, stats: GenerationStats | None) -> tuple[Decision, ...]:
    """The policy's logged decisions, or (without a policy) the server default and any mode
    change seen in the cycle records."""
    controller = prepared.decision_log
    if controller is not None and controller.records:
        return tuple(
            Decision(
                cycle=r.step,
                mode=r.mode,
                block_size=r.block_size,
                reason=r.reason,
                span=r.span,
                kind=r.kind,
            )
            for r in controller.records
        )
    if prepared.upstream is not None:
        why = f" ({prepared.route})" if prepared.route else ""
        return (Decision(cycle=0, mode="upstream", reason=f"routed to {prepared.upstream}{why}"),)
    req = prepared.request
    out = [Decision(cycle=0, mode=req.mode, block_size=req.block_size, reason="server default")]
    cycles = stats.cycles if stats else ()
    for prev, c in zip(cycles, cycles[1:], strict=False):
        if c.mode != prev.mode:
            out.append(Decision(cycle=c.index, mode=c.mode, reason="engine switched mode"))
    return tuple(out)


@dataclass
class RequestRun:
    """Timing and outcome of one request, from arrival to its log line."""

    ctx: GatewayContext
    api: str  # the dialect: chat, completions, messages, responses
    request_id: str
    model: str
    stream: bool
    ignored_fields: list[str]
    arrived: float = field(default_factory=time.perf_counter)
    job: Job | None = None
    prepared: Prepared | None = None
    reader: EventReader | None = None
    outcome: str = "pending"
    recorded: bool = False

    @property
    def wants_logprobs(self) -> bool:
        return self.prepared is not None and self.prepared.request.logprobs is not None

    @property
    def stats(self) -> GenerationStats | None:
        ending = self.reader.ending if self.reader else None
        return ending.stats if ending else None

    @property
    def finish_reason(self) -> str:
        ending = self.reader.ending if self.reader else None
        return ending.finish_reason if ending else ""

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

    @property
    def mode_label(self) -> str:
        s = self.stats
        if s is not None and s.modes:
            return "+".join(s.modes)
        if self.prepared is not None and self.prepared.upstream is not None:
            return "upstream"
        return self.prepared.request.mode if self.prepared else "none"

    def timings(self) -> Timings:
        now = time.perf_counter()
        job = self.job
        started = job.started_at if job and job.started_at else now
        first = job.first_token_at if job else None
        s = self.stats
        return Timings(
            queue_s=round(started - self.arrived, 6),
            prefill_s=round(s.prefill_s, 6) if s else 0.0,
            decode_s=round(s.decode_s, 6) if s else 0.0,
            ttft_s=round(first - self.arrived, 6) if first else None,
            e2e_s=round(now - self.arrived, 6),
        )

    def snapshot(self, *, status: int = 200, error: str | None = None) -> RequestRecord:
        """The request's record as of now."""
        p = self.prepared
        s = self.stats
        output = self.reader.output if self.reader else None
        answer = self.reader.answer if self.reader else None
        ended = self.reader is not None and self.reader.ending is not None
        prep = (
            Prep(
                mode=p.request.mode,
                prompt_tokens=len(p.request.prompt_tokens),
                sampling=sampling_info(p.request.sampling, p.sampling_defaults),
                max_tokens=p.request.max_tokens,
                max_tokens_clamped=p.max_tokens_clamped,
                decisions=decisions(p, s),
            )
            if p is not None
            else None
        )
        return RequestRecord(
            id=self.request_id,
            api=self.api,
            model=self.model,
            stream=self.stream,
            request_class=p.request_class.label if p else "unknown",
            mode=self.mode_label,
            outcome=self.outcome,
            status=status,
            finish_reason=self.finish_reason or None,
            error=error,
            timings=self.timings(),
            stats=s,
            prep=prep,
            ignored_fields=tuple(self.ignored_fields),
            tool_calls=tuple(output.reports) if output else (),
            rejected_tool_spans=tuple(output.rejected) if output else (),
            tool_results=output.results() if output and ended else (),
            structured_output=answer.as_dict() if answer else None,
            finished_at=time.time(),
        )

    def info(self) -> ToolflashInfo:
        """The `toolflash` object: how this response was decoded."""
        return toolflash_info(self.snapshot())

    def record(self, *, status: int = 200, error: str | None = None) -> None:
        """Metrics, status ring and the one log line; idempotent."""
        if self.recorded:
            return
        self.recorded = True
        r = self.snapshot(status=status, error=error)
        if r.prep is not None:
            self.ctx.metrics.record(r)
            self.ctx.status.add(r)
        log.info("request", **log_fields(r))
