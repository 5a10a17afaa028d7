"""POST /v1/chat/completions: request -> worker job -> message (or SSE chunks)."""

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
from toolflash.gateway.chat_output import (
    ChatOutput,
    ContentDelta,
    Delta,
    MessageFold,
    ReasoningDelta,
    ToolCallDelta,
)
from toolflash.gateway.chat_prompt import ChatPrompt, chat_prompt, offered_tools
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.errors import to_gateway_error
from toolflash.gateway.logprobs import chat_logprobs
from toolflash.gateway.protocol import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChoiceLogprobs,
    ChunkChoice,
    DeltaFunction,
    DeltaToolCall,
    PromptTokensDetails,
    ResponseMessage,
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
from toolflash.gateway.structured import JsonAnswer
from toolflash.gateway.tool_parsers import get_parser
from toolflash.gateway.validation import check_chat_supported
from toolflash.gateway.worker import Prepared
from toolflash.policy.request_class import classify


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    return tuple(s for s in items if s)


def chat_preparer(
    req: ChatCompletionRequest,
    prompt: ChatPrompt,
    config: GatewayConfig,
    request_id: str,
    controller_factory: ControllerFactory | None = None,
) -> Callable[[Engine], Prepared]:
    """The worker-side half of a chat request (rendered already, on a render thread): budget,
    sampling, class and the policy's controller."""
    thinking = (req.chat_template_kwargs or {}).get("enable_thinking")
    requested = req.max_completion_tokens or req.max_tokens
    tool_choice = req.tool_choice or "auto"
    if not isinstance(tool_choice, str):
        tool_choice = "named"
    tokens = prompt.tokens
    bound = prompt.constraint

    def prepare(engine: Engine) -> Prepared:
        max_tokens, clamped = token_budget(
            len(tokens), requested, engine.context_length, config.default_max_tokens
        )
        sampling = resolve_sampling(req, engine.generation_defaults, engine.vocab_size)
        request_class = classify(
            tools_offered=offered_tools(req) is not None,
            tool_choice=tool_choice,
            response_format=req.response_format.type if req.response_format else None,
            enable_thinking=thinking if isinstance(thinking, bool) else None,
            last_role=req.messages[-1].role,
            prompt_tokens=len(tokens),
            strict_tools=bound is not None
            and bound.kind == "tool_calls"
            and not bound.require_call,
            sampled=not sampling.params.greedy,  # after the model's defaults
        )
        request = GenerationRequest(
            prompt_tokens=tokens,
            max_tokens=max_tokens,
            mode=config.mode,
            block_size=config.block_size,
            stop_strings=stop_strings(req.stop),
            sampling=sampling.params,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            request_id=request_id,
            publish_at=prompt.publish_at,
            constraint=bound,
        )
        return Prepared(
            request,
            request_class,
            prompt.start_in_reasoning,
            clamped,
            decision_log(
                controller_factory,
                engine,
                request_class,
                start_in_reasoning=prompt.start_in_reasoning,
                response_format_json=request_class.kind == "json",
            ),
            sampling_defaults=sampling.from_model_defaults,
        )

    return prepare


def chat_finish_reason(engine_reason: str, output: ChatOutput) -> str:
    """length wins (a call cut by max_tokens ends with "length"); "tool_calls" only when a call
    parsed; a cancel we issued (parallel_tool_calls false) also ends with "tool_calls"."""
    if engine_reason == "length":
        return "length"
    return "tool_calls" if output.valid_calls else "stop"


def parse_chat(raw: bytes, ctx: GatewayContext) -> tuple[ChatCompletionRequest, str]:
    """The validated request and the served model it names (on a render thread)."""
    req = ChatCompletionRequest.model_validate(parse_json(raw, ctx.config.max_json_depth))
    model = ctx.resolve_model(req.model)
    check_chat_supported(req, ctx.config, ctx.engine().context_length)
    return req, model


async def create_chat_completion(request: Request) -> Response:
    ctx = gateway(request)
    raw = await read_body(request, ctx.config.max_body_bytes)
    req, model = await ctx.offload(lambda: parse_chat(raw, ctx))
    engine = ctx.engine()
    run = RequestRun(ctx, "chat", new_id("chatcmpl"), model, bool(req.stream), req.ignored_fields())
    try:
        prompt = await ctx.offload(lambda: chat_prompt(req, engine))
    except Exception as exc:
        raise run.fail(exc) from exc
    job = run.submit(chat_preparer(req, prompt, ctx.config, run.request_id, ctx.controller_factory))
    watcher = asyncio.create_task(watch_disconnect(request, job))
    try:
        prepared = await run.wait_prepared()
        tools = offered_tools(req)
        bound = prepared.request.constraint
        output = ChatOutput(
            parser=get_parser(engine.tool_call_format) if tools else None,
            tools={t.function.name: t.function.parameters for t in req.tools or []}
            if tools
            else {},
            start_in_reasoning=prepared.start_in_reasoning,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            # Forced calls: a call cut by max_tokens comes back as content, not half a call.
            hold_calls=bound is not None and bound.kind == "tool_calls" and bound.require_call,
        )
        answer = (
            JsonAnswer(bound, stop_strings(req.stop))
            if bound is not None and bound.kind == "json"
            else None
        )
        if req.stream:
            watcher.cancel()  # StreamingResponse watches for the disconnect from here on
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                stream_chat(run, output, include_usage, answer),
                media_type="text/event-stream",
                headers={
                    "x-toolflash-mode": prepared.request.mode,
                    "x-request-id": run.request_id,
                    "cache-control": "no-cache",
                },
            )
        return await complete_chat(run, output, answer)
    finally:
        watcher.cancel()


def _usage(run: RequestRun) -> Usage:
    s = run.stats
    assert s is not None
    return Usage(
        prompt_tokens=s.prompt_tokens,
        completion_tokens=s.completion_tokens,
        total_tokens=s.prompt_tokens + s.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=s.cached_tokens),
    )


def _extra(output: ChatOutput, answer: JsonAnswer | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "tool_calls": [r.as_dict() for r in output.reports],
        "rejected_tool_spans": output.rejected,
    }
    if answer is not None:
        extra["structured_output"] = answer.as_dict()
    return extra


async def _drive(
    run: RequestRun, output: ChatOutput, answer: JsonAnswer | None = None
) -> AsyncIterator[list[Delta]]:
    """Engine events -> delta groups, one per batch of events read together (`Job.batches`:
    a stream reads at most one batch per `stream_interval_ms`); sets the run's stats and
    finish reason at the end."""
    assert run.job is not None
    async for batch in run.job.batches(run.ctx.config.stream_interval_ms / 1e3):
        deltas: list[Delta] = []
        tokens = [e for e in batch if isinstance(e, TokenEvent)]
        if tokens:
            if any(e.token_ids for e in tokens):
                run.token_seen()
            for e in tokens:
                run.logprobs.extend(e.logprobs)
            deltas = output.feed("".join(e.text for e in tokens))
            if output.stop_requested:
                run.job.cancel.set()  # parallel_tool_calls false: one call, then stop
            if answer is not None:
                answer.add(deltas)
        event = batch[-1]
        if isinstance(event, FinishEvent):
            closing = output.close()
            deltas += closing
            run.stats = event.stats
            run.finish_reason = chat_finish_reason(event.finish_reason, output)
            run.tool_calls = output.results()
            if event.finish_reason == "cancelled" and not output.stop_requested:
                run.outcome = "cancelled"
            if answer is not None:
                answer.add(closing)
                failed = answer.finish(run.finish_reason, output.valid_calls)
                if failed is not None:
                    raise failed
        if deltas:
            yield deltas


async def complete_chat(
    run: RequestRun, output: ChatOutput, answer: JsonAnswer | None = None
) -> Response:
    fold = MessageFold()
    try:
        async for deltas in _drive(run, output, answer):
            fold.add(deltas)
    except Exception as exc:
        raise run.fail(exc) from exc
    if run.outcome != "cancelled":
        run.outcome = "success"
    msg = fold.message()
    completion = ChatCompletion(
        id=run.request_id,
        created=int(time.time()),
        model=run.model,
        choices=[
            ChatChoice(
                message=ResponseMessage.model_validate(msg),
                finish_reason=run.finish_reason,
                logprobs=chat_logprobs(run.take_logprobs()) if run.wants_logprobs else None,
            )
        ],
        usage=_usage(run),
        toolflash=run.info(_extra(output, answer)),
    )
    run.record()
    return JSONResponse(
        completion.model_dump(mode="json"),
        headers={"x-toolflash-mode": run.mode_label, "x-request-id": run.request_id},
    )


def delta_messages(deltas: list[Delta]) -> list[ChatDelta]:
    """Group deltas into chunk deltas: one per run of the same kind (and tool-call index)."""
    out: list[ChatDelta] = []
    for d in deltas:
        last = out[-1] if out else None
        if isinstance(d, ReasoningDelta):
            if last is not None and last.reasoning_content is not None:
                last.reasoning_content += d.text
            else:
                out.append(ChatDelta(reasoning_content=d.text))
        elif isinstance(d, ContentDelta):
            if last is not None and last.content is not None:
                last.content += d.text
            else:
                out.append(ChatDelta(content=d.text))
        elif isinstance(d, ToolCallDelta):
            calls = last.tool_calls if last is not None else None
            if d.id is None and calls and calls[-1].index == d.index:
                calls[-1].function.arguments = (calls[-1].function.arguments or "") + d.arguments
                continue
            call = DeltaToolCall(
                index=d.index,
                id=d.id,
                type="function" if d.id else None,
                function=DeltaFunction(name=d.name, arguments=d.arguments),
            )
            out.append(ChatDelta(tool_calls=[call]))
    return out


def _pending_logprobs(run: RequestRun) -> ChoiceLogprobs | None:
    if not run.wants_logprobs or not run.logprobs:
        return None
    return chat_logprobs(run.take_logprobs())


async def stream_chat(
    run: RequestRun, output: ChatOutput, include_usage: bool, answer: JsonAnswer | None = None
) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(**kw: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=run.request_id, created=created, model=run.model, **kw)

    status, error = 200, None
    try:
        try:
            yield sse.event(
                chunk(choices=[ChunkChoice(delta=ChatDelta(role="assistant", content=""))])
            )
            # One write per batch of deltas: the events of its chunks go out together.
            async for deltas in _drive(run, output, answer):
                # A chunk carries the log-probabilities of the tokens received since the last
                # chunk (a batch's first chunk carries its events').
                yield "".join(
                    sse.event(
                        chunk(choices=[ChunkChoice(delta=d, logprobs=_pending_logprobs(run))])
                    )
                    for d in delta_messages(deltas)
                )
            info = run.info(_extra(output, answer))
            final = ChunkChoice(
                delta=ChatDelta(), finish_reason=run.finish_reason, logprobs=_pending_logprobs(run)
            )
            end = sse.event(chunk(choices=[final], toolflash=None if include_usage else info))
            if include_usage:
                end += sse.event(chunk(choices=[], usage=_usage(run), toolflash=info))
            if run.outcome == "pending":
                run.outcome = "success"
        except Exception as exc:  # after headers: an error event, then [DONE]
            err = to_gateway_error(exc)
            status, error, run.outcome = err.status, err.message, "error"
            end = sse.event(err.body())
        yield end + sse.DONE
    finally:
        if run.outcome == "pending":  # the client went away mid-stream
            run.outcome = "cancelled"
        if run.job is not None:
            run.job.cancel.set()
        run.record(status=status, error=error)
