"""The one record of a request's facts, and what is derived from it: the response's `toolflash`
object, the /v1/status row and the log line (the metrics read it in `GatewayMetrics.record`).

A `RequestRun` (gateway/serving.py) takes a record when it builds a response (the extension
field) and once more when the request ends (metrics, status, log): the same type, so the four
views cannot disagree about a fact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolflash.engine.api import GenerationStats
from toolflash.gateway.chat_output import ToolCallReport
from toolflash.gateway.protocol import (
    ConstraintInfo,
    Decision,
    SamplingInfo,
    StructuredOutputCheck,
    Timings,
    ToolCallReportModel,
    ToolflashInfo,
)


@dataclass(frozen=True)
class Prep:
    """What the worker decided for a request before generating (absent for a request that
    failed before it was prepared)."""

    mode: str
    prompt_tokens: int
    sampling: SamplingInfo
    max_tokens: int
    max_tokens_clamped: bool
    decisions: tuple[Decision, ...]


@dataclass(frozen=True)
class RequestRecord:
    """One request as far as it went: identity, outcome, timings, the engine's totals and how
    the output parsed."""

    id: str
    api: str  # the route's dialect: chat, completions, messages, responses
    model: str
    stream: bool
    request_class: str  # "unknown" before preparation
    mode: str  # the modes that ran, "+"-joined; the requested one before any ran
    outcome: str  # "success" | "error" | "cancelled" | "pending"
    status: int
    finish_reason: str | None
    error: str | None
    timings: Timings
    stats: GenerationStats | None
    prep: Prep | None
    ignored_fields: tuple[str, ...] = ()
    tool_calls: tuple[ToolCallReport, ...] = ()
    rejected_tool_spans: tuple[dict[str, Any], ...] = ()
    # One entry per tool-call span: "valid", "schema_invalid", "malformed", "truncated",
    # "undeclared_tool" (see ToolCallReport / SpanRejected).
    tool_results: tuple[str, ...] = ()
    structured_output: dict[str, Any] | None = None
    finished_at: float = 0.0


def _constraint(s: GenerationStats | None) -> ConstraintInfo | None:
    c = s.constraint if s else None
    if c is None:
        return None
    return ConstraintInfo(
        mask_rows=c.mask_rows,
        mask_s=round(c.mask_s, 6),
        drafted_checked=c.drafted,
        grammar_rejected=c.grammar_rejected,
        grammar_cuts=c.grammar_cuts,
        forced_runs=c.forced_runs,
        forced_tokens=c.forced_tokens,
    )


def toolflash_info(r: RequestRecord) -> ToolflashInfo:
    """The `toolflash` object: how this response was decoded (a prepared request's record)."""
    assert r.prep is not None
    s = r.stats
    return ToolflashInfo(
        request_id=r.id,
        request_class=r.request_class,
        mode=r.mode,
        modes=list(s.modes) if s else [],
        cycles=len(s.cycles) if s else 0,
        spec_cycles=s.spec_cycles if s else 0,
        tokens_per_cycle=round(s.tokens_per_cycle, 4) if s else 0.0,
        drafted=s.drafted if s else 0,
        accepted=s.accepted if s else 0,
        decisions=list(r.prep.decisions),
        sampling=r.prep.sampling,
        max_tokens=r.prep.max_tokens,
        max_tokens_clamped=r.prep.max_tokens_clamped,
        decode_tokens_per_s=round(s.decode_tokens_per_s, 3) if s else 0.0,
        timings=r.timings,
        batch_band=s.batch_band if s else "1",
        tool_calls=[ToolCallReportModel(**t.as_dict()) for t in r.tool_calls],
        rejected_tool_spans=list(r.rejected_tool_spans),
        ignored_fields=list(r.ignored_fields),
        structured_output=StructuredOutputCheck(**r.structured_output)
        if r.structured_output
        else None,
        constraint=_constraint(s),
        prefill_sparse=s.sparse if s else False,
        prefill_computed_tokens=s.computed_tokens if s else 0,
    )


def status_row(r: RequestRecord) -> dict[str, Any]:
    """A finished request as /v1/status lists it."""
    s = r.stats
    t = r.timings
    return {
        "id": r.id,
        "endpoint": r.api,
        "request_class": r.request_class,
        "mode": r.mode,
        "outcome": r.outcome,
        "finish_reason": r.finish_reason or "",
        "prompt_tokens": s.prompt_tokens if s else (r.prep.prompt_tokens if r.prep else 0),
        "cached_tokens": s.cached_tokens if s else 0,
        "completion_tokens": s.completion_tokens if s else 0,
        "cycles": len(s.cycles) if s else 0,
        "tokens_per_cycle": round(s.tokens_per_cycle, 4) if s else 0.0,
        "drafted": s.drafted if s else 0,
        "accepted": s.accepted if s else 0,
        "queue_s": t.queue_s,
        "ttft_s": t.ttft_s,
        "decode_tokens_per_s": round(s.decode_tokens_per_s, 3) if s else 0.0,
        "e2e_s": t.e2e_s,
        "finished_at": r.finished_at,
    }


def log_fields(r: RequestRecord) -> dict[str, Any]:
    """The fields of the request's one log line."""
    s = r.stats
    t = r.timings
    return {
        "id": r.id,
        "endpoint": r.api,
        "stream": r.stream,
        "request_class": r.request_class,
        "mode": r.mode,
        "status": r.status,
        "outcome": r.outcome,
        "finish_reason": r.finish_reason or None,
        "prompt_tokens": s.prompt_tokens if s else None,
        "cached_tokens": s.cached_tokens if s else None,
        "completion_tokens": s.completion_tokens if s else None,
        "cycles": len(s.cycles) if s else None,
        "tokens_per_cycle": round(s.tokens_per_cycle, 3) if s else None,
        "queue_s": t.queue_s,
        "ttft_s": t.ttft_s,
        "e2e_s": t.e2e_s,
        "decode_tok_s": round(s.decode_tokens_per_s, 2) if s else None,
        "ignored_fields": list(r.ignored_fields) or None,
        "error": r.error,
    }
