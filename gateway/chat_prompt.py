"""A chat request's prompt: the messages in the chat template's shape, the output constraint,
and the rendered and tokenized prompt with its stable prefix.

`chat_prompt` runs on the gateway's render threads (`GatewayContext.offload`), not on the
engine thread: a template, a schema compile or a long tokenization then cannot hold up the
request being decoded, and a time budget bounds each one. It refuses, without rendering
anything, a conversation whose text cannot fit the context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from toolflash.engine.api import Engine, OutputConstraint
from toolflash.gateway.errors import BadRequest
from toolflash.gateway.limits import check_json_tree, check_prompt_chars
from toolflash.gateway.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    SystemMessage,
    ToolMessage,
    UserMessage,
    content_text,
)
from toolflash.gateway.structured import build_constraint, for_prompt, reasoning_mode

# Replayed tool-call arguments deeper than this reach the template as their raw string.
_MAX_ARGUMENT_DEPTH = 32


@dataclass(frozen=True)
class ChatPrompt:
    """What the worker needs from a rendered chat request."""

    tokens: tuple[int, ...]
    publish_at: tuple[int, ...]  # where the prefix cache publishes (the stable prefix)
    start_in_reasoning: bool
    constraint: OutputConstraint | None  # bound to the engine's tool format and the prompt


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
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.function.name,
                            "arguments": _arguments(c.function.arguments),
                        },
                    }
                    for c in m.tool_calls
                ]
            out.append(msg)
    return out


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


def offered_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """Tools to render, or None (no tools, or tool_choice 'none')."""
    if not req.tools or req.tool_choice == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]


def rendered_chars(req: ChatCompletionRequest) -> int:
    """Characters every chat template renders verbatim: system, user and tool message text.
    (Assistant turns are left out: templates may drop their reasoning or rewrite them.)"""
    return sum(
        len(content_text(m.content))
        for m in req.messages
        if isinstance(m, SystemMessage | UserMessage | ToolMessage)
    )


def chat_prompt(req: ChatCompletionRequest, engine: Engine) -> ChatPrompt:
    """Check, render and tokenize a chat request (on a render thread)."""
    check_prompt_chars(
        rendered_chars(req), engine.context_length, engine.max_token_chars, "messages"
    )
    # response_format / forced or strict tools: a grammar (a bad schema is a 400 here).
    constraint = build_constraint(req)
    messages = template_messages(req)
    tools = offered_tools(req)
    template_kwargs = dict(req.chat_template_kwargs or {})
    tokens = render(engine, messages, tools, template_kwargs)
    # Templates that open the answer inside <think> leave the tag at the prompt's end.
    tail = engine.decode(tokens[-8:])
    start_in_reasoning = tail.rstrip().endswith("<think>")
    bound = (
        for_prompt(
            constraint,
            engine.tool_call_format,
            reasoning_mode(tail, template_kwargs.get("enable_thinking"), start_in_reasoning),
        )
        if constraint is not None
        else None
    )
    # The prefix cache publishes here so the agent's next turn (same history plus more)
    # restores instead of recomputing. `tokens` is this thread's last encode_chat result: the
    # real engine reads the prefix length off that tokenization instead of tokenizing again.
    n = engine.stable_prefix(messages, tools, template_kwargs, tokens) if tokens else 0
    return ChatPrompt(tuple(tokens), (n,) if n > 0 else (), start_in_reasoning, bound)


def render(
    engine: Engine,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
) -> list[int]:
    """Apply the chat template; a template that refuses the conversation (jinja's
    `raise_exception`, e.g. a misplaced system message) is the client's error, not ours."""
    try:
        return engine.encode_chat(messages, tools, template_kwargs)
    except Exception as exc:
        if type(exc).__module__.startswith("jinja2"):
            raise BadRequest(f"the chat template rejected the messages: {exc}") from None
        raise
