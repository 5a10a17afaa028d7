"""Chat and text completions bodies -> the neutral `ApiRequest` (pure: no engine, no starlette)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from toolflash.gateway.errors import BadRequest
from toolflash.gateway.limits import check_json_tree
from toolflash.gateway.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    ResponseFormat,
    SystemMessage,
    ToolMessage,
    UserMessage,
    content_text,
)
from toolflash.gateway.request import (
    ApiRequest,
    Conversation,
    JsonFormat,
    SamplingFields,
    TextPrompt,
    Tool,
    ToolChoice,
    stop_strings,
)

# Replayed tool-call arguments deeper than this reach the template as their raw string.
_MAX_ARGUMENT_DEPTH = 32


def template_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages in the shape HF chat templates read (tool-call arguments as objects)."""
    out: list[dict[str, Any]] = []
    for m in req.messages:
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": content_text(m.content)})
        elif isinstance(m, UserMessage):
            out.append({"role": "user", "content": content_text(m.content)})
        elif isinstance(m, ToolMessage):
            out.append(
                {"role": "tool", "content": content_text(m.content), "tool_call_id": m.tool_call_id}
            )
        elif isinstance(m, AssistantMessage):
            msg: dict[str, Any] = {"role": "assistant", "content": content_text(m.content)}
            if m.reasoning_content:
                msg["reasoning_content"] = m.reasoning_content
            if m.tool_calls:
                msg["tool_calls"] = [
                    template_call(c.id, c.function.name, c.function.arguments) for c in m.tool_calls
                ]
            out.append(msg)
    return out


def template_call(call_id: str, name: str, arguments: str | Mapping[str, Any]) -> dict[str, Any]:
    """A replayed tool call as templates read it (every dialect's history goes through it)."""
    args = arguments if isinstance(arguments, Mapping) else _arguments(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _arguments(text: str) -> Any:
    """Templates iterate arguments as a mapping; a replayed call whose arguments do not parse
    (e.g. one cut by max_tokens) is passed on as the raw string instead of failing the turn."""
    try:
        value = json.loads(text)
        # What the template renders must pass the body's own checks (depth, encodable
        # strings); the raw string always does.
        check_json_tree(value, _MAX_ARGUMENT_DEPTH)
    except (json.JSONDecodeError, RecursionError, BadRequest):
        return text
    return value if isinstance(value, dict) else text


def rendered_chars(req: ChatCompletionRequest) -> int:
    """Characters every chat template renders verbatim: system, user and tool message text.
    (Assistant turns are left out: templates may drop their reasoning or rewrite them.)"""
    return sum(
        len(content_text(m.content))
        for m in req.messages
        if isinstance(m, SystemMessage | UserMessage | ToolMessage)
    )


def json_format(fmt: ResponseFormat | None) -> JsonFormat | None:
    """`response_format` as a JSON answer (None for text); a json_schema without its schema
    object is a 400 (as OpenAI's: json_object asks for any object)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return JsonFormat()
    spec = fmt.json_schema
    param = "response_format.json_schema"
    if not isinstance(spec, Mapping):
        raise BadRequest(
            "response_format 'json_schema' needs a json_schema object "
            '({"name": ..., "schema": {...}, "strict": true})',
            param=param,
        )
    schema = spec.get("schema")
    if schema is None:
        raise BadRequest(
            "response_format 'json_schema' needs json_schema.schema (use type 'json_object' "
            "for any JSON object)",
            param=f"{param}.schema",
        )
    return JsonFormat(
        dict(schema), spec.get("strict") is True, f"{param}.schema", kind="json_schema"
    )


def chat_conversation(req: ChatCompletionRequest) -> Conversation:
    choice = req.tool_choice or "auto"
    return Conversation(
        messages=tuple(template_messages(req)),
        tools=tuple(
            Tool(
                t.function.name,
                t.function.parameters,
                bool(t.function.strict),
                t.model_dump(exclude_none=True),
            )
            for t in req.tools or []
        ),
        tool_choice=ToolChoice("named", choice.function.name)
        if isinstance(choice, NamedToolChoice)
        else ToolChoice(choice),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        json_format=json_format(req.response_format),
        template_kwargs=dict(req.chat_template_kwargs or {}),
        verbatim_chars=rendered_chars(req),
    )


def sampling_fields(req: ChatCompletionRequest | CompletionRequest) -> SamplingFields:
    return SamplingFields(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        seed=req.seed,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        logit_bias=req.logit_bias,
    )


def chat_request(req: ChatCompletionRequest) -> ApiRequest:
    """A chat completions body as the neutral request (400s for a malformed response_format)."""
    return ApiRequest(
        prompt=chat_conversation(req),
        max_tokens=req.max_completion_tokens or req.max_tokens,
        sampling=sampling_fields(req),
        stop=stop_strings(req.stop),
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        sparse_prefill=req.sparse_prefill,
        ignore_eos=req.ignore_eos is True,
    )


def completion_request(req: CompletionRequest) -> ApiRequest:
    """A text completions body as the neutral request (one prompt: checked by validation)."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
        prompt = prompt[0]
    text = TextPrompt(text=prompt) if isinstance(prompt, str) else None
    return ApiRequest(
        prompt=text or TextPrompt(token_ids=tuple(int(t) for t in prompt)),
        max_tokens=req.max_tokens,
        sampling=sampling_fields(req),
        stop=stop_strings(req.stop),
        logprobs=req.logprobs,
        sparse_prefill=req.sparse_prefill,
        ignore_eos=req.ignore_eos is True,
    )
