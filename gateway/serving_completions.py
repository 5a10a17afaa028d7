"""POST /v1/completions: raw text in, raw text out (no template, no tool or reasoning parsing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from toolflash.engine.api import (
    Engine,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
)
from toolflash.gateway import sse
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.errors import to_gateway_error
from toolflash.gateway.limits import check_prompt_chars, check_token_ids
from toolflash.gateway.logprobs import completion_logprobs
from toolflash.gateway.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    PromptTokensDetails,
    Usage,
)
from toolflash.gateway.sampling import resolve_sampling
from toolflash.gateway.serving import (
    ControllerFactory,
    GatewayContext,
    RequestRun,
    decision_log,
    gateway,
    new_id,
    parse_json,
    read_body,
    token_budget,
    watch_disconnect,
)
from toolflash.gateway.serving_chat import stop_strings
from toolflash.gateway.validation import check_completion_supported
from toolflash.gateway.worker import Prepared
from toolflash.policy.request_class import classify


def completion_tokens(req: CompletionRequest, engine: Engine) -> tuple[int, ...]:
    """The prompt's token ids (on a render thread): text is tokenized once it could fit the
    context; ids must index the model's vocabulary (ids past it reached MLX's embedding)."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
        prompt = prompt[0]  # one prompt (checked by validation)
    if isinstance(prompt, str):
        check_prompt_chars(len(prompt), engine.context_length, engine.max_token_chars, "prompt")
        return tuple(engine.encode(prompt))
    ids = [int(t) for t in prompt]
    check_token_ids(ids, engine.vocab_size)
    return tuple(ids)


def completion_preparer(
    req: CompletionRequest,
    tokens: tuple[int, ...],
    config: GatewayConfig,
    request_id: str,
    controller_factory: ControllerFactory | None = None,
) -> Callable[[Engine], Prepared]:
    def prepare(engine: Engine) -> Prepared:
        max_tokens, clamped = token_budget(
            len(tokens), req.max_tokens, engine.context_length, config.default_max_tokens
        )
        sampling = resolve_sampling(req, engine.generation_defaults, engine.vocab_size)
        request = GenerationRequest(
            prompt_tokens=tokens,
            max_tokens=max_tokens,
            mode=config.mode,
            block_size=config.block_size,
            stop_strings=stop_strings(req.stop),
            sampling=sampling.params,
            logprobs=req.logprobs,
            request_id=request_id,
        )
        request_class = classify(
            tools_offered=False,
            tool_choice="none",
            response_format=None,
            enable_thinking=None,
            last_role=None,
            prompt_tokens=len(tokens),
            sampled=not sampling.params.greedy,  # after the model's defaults
        )
        return Prepared(
            request,
            request_class,
            False,
            clamped,
            decision_log(controller_factory, engine, request_class),
            sampling_defaults=sampling.from_model_defaults,
        )

    return prepare


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _usage(run: RequestRun) -> Usage:
    s = run.stats
    assert s is not None
    return Usage(
        prompt_tokens=s.prompt_tokens,
        completion_tokens=s.completion_tokens,
        total_tokens=s.prompt_tokens + s.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=s.cached_tokens),
    )


async def _texts(run: RequestRun) -> AsyncIterator[str]:
    """The text of each batch of engine events (`Job.batches`: at most one batch per
    `stream_interval_ms`); sets the run's stats and finish reason at the end."""
    assert run.job is not None
    async for batch in run.job.batches(run.ctx.config.stream_interval_ms / 1e3):
        text = ""
        for event in batch:
            if isinstance(event, TokenEvent):
                if event.token_ids:
                    run.token_seen()
                run.logprobs.extend(event.logprobs)
                text += event.text
            elif isinstance(event, FinishEvent):
                run.stats = event.stats
                run.finish_reason = _finish(event.finish_reason)
                if event.finish_reason == "cancelled":
                    run.outcome = "cancelled"
        if text:
            yield text


def parse_completion(raw: bytes, ctx: GatewayContext) -> tuple[CompletionRequest, str]:
    """The validated request and the served model it names (on a render thread)."""
    req = CompletionRequest.model_validate(parse_json(raw, ctx.config.max_json_depth))
    model = ctx.resolve_model(req.model)
    check_completion_supported(req, ctx.engine().context_length)
    return req, model


async def create_completion(request: Request) -> Response:
    ctx = gateway(request)
    raw = await read_body(request, ctx.config.max_body_bytes)
    req, model = await ctx.offload(lambda: parse_completion(raw, ctx))
    engine = ctx.engine()
    run = RequestRun(
        ctx, "completions", new_id("cmpl"), model, bool(req.stream), req.ignored_fields()
    )
    try:
        tokens = await ctx.offload(lambda: completion_tokens(req, engine))
    except Exception as exc:
        raise run.fail(exc) from exc
    job = run.submit(
        completion_preparer(req, tokens, ctx.config, run.request_id, ctx.controller_factory)
    )
    watcher = asyncio.create_task(watch_disconnect(request, job))
    try:
        prepared = await run.wait_prepared()
        if req.stream:
            watcher.cancel()
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _stream(run, include_usage),
                media_type="text/event-stream",
                headers={"x-toolflash-mode": prepared.request.mode, "x-request-id": run.request_id},
            )
        text = ""
        try:
            async for piece in _texts(run):
                text += piece
        except Exception as exc:
            raise run.fail(exc) from exc
        if run.outcome == "pending":
            run.outcome = "success"
        body_out = Completion(
            id=run.request_id,
            created=int(time.time()),
            model=run.model,
            choices=[
                CompletionChoice(
                    text=text, finish_reason=run.finish_reason, logprobs=_pending_logprobs(run)
                )
            ],
            usage=_usage(run),
            toolflash=run.info(),
        )
        run.record()
        return JSONResponse(
            body_out.model_dump(mode="json"),
            headers={"x-toolflash-mode": run.mode_label, "x-request-id": run.request_id},
        )
    finally:
        watcher.cancel()


def _pending_logprobs(run: RequestRun) -> CompletionLogprobs | None:
    """The log-probabilities of the tokens since the last chunk, offsets continuing."""
    if not run.wants_logprobs:
        return None
    items = run.take_logprobs()
    out = completion_logprobs(items, run.logprob_offset)
    run.logprob_offset += sum(len(t.text) for t in items)
    return out


async def _stream(run: RequestRun, include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(**kw: Any) -> Completion:
        return Completion(id=run.request_id, created=created, model=run.model, **kw)

    status, error = 200, None
    try:
        try:
            async for text in _texts(run):
                lp = _pending_logprobs(run)
                choice = CompletionChoice(text=text, finish_reason=None, logprobs=lp)
                yield sse.event(chunk(choices=[choice]))
            info = run.info()
            final = CompletionChoice(
                text="", finish_reason=run.finish_reason, logprobs=_pending_logprobs(run)
            )
            # The last chunks and [DONE] in one write.
            end = sse.event(chunk(choices=[final], toolflash=None if include_usage else info))
            if include_usage:
                end += sse.event(chunk(choices=[], usage=_usage(run), toolflash=info))
            if run.outcome == "pending":
                run.outcome = "success"
        except Exception as exc:
            err = to_gateway_error(exc)
            status, error, run.outcome = err.status, err.message, "error"
            end = sse.event(err.body())
        yield end + sse.DONE
    finally:
        if run.outcome == "pending":
            run.outcome = "cancelled"
        if run.job is not None:
            run.job.cancel.set()
        run.record(status=status, error=error)
