"""Anthropic Messages request -> the neutral `ApiRequest` (pure: no engine, no starlette).

Content blocks become the chat template's messages: `system` (a string or text blocks) the
system message, as is a mid-conversation `system` turn where it stands; a user turn's `tool_result` blocks one `tool` message each (in order, its text
blocks joined by newlines, prefixed `Error: ` when `is_error`), its text blocks user messages;
an assistant turn's text its content, its `thinking` its reasoning and its `tool_use` blocks
its tool calls. `tool_choice` any / tool / none are OpenAI's required / named / none;
`disable_parallel_tool_use` is parallel_tool_calls false; `thinking` enabled or adaptive turns
the template's thinking switch on, disabled off (absent: the template's default).
"""

from __future__ import annotations

from typing import Any

from toolflash.gateway.dialects.anthropic_protocol import (
    CountTokensRequest,
    MessageParam,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from toolflash.gateway.dialects.openai_request import template_call
from toolflash.gateway.errors import NotImplementedYet
from toolflash.gateway.request import (
    ApiRequest,
    Conversation,
    JsonFormat,
    SamplingFields,
    Tool,
    ToolChoice,
)

# What a tool result that failed says to the model (Anthropic's `is_error`).
ERROR_PREFIX = "Error: "


def _text(content: str | list[TextBlock] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(b.text for b in content)


def tool_result_text(block: ToolResultBlock) -> str:
    text = _text(block.content)
    return ERROR_PREFIX + text if block.is_error else text


def _user(m: MessageParam, out: list[dict[str, Any]]) -> int:
    """Append a user turn's template messages; the characters they render verbatim."""
    if isinstance(m.content, str):
        out.append({"role": "user", "content": m.content})
        return len(m.content)
    chars = 0
    texts: list[str] = []
    for block in m.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
            continue
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        assert isinstance(block, ToolResultBlock)  # the protocol allows no other here
        text = tool_result_text(block)
        chars += len(text)
        out.append({"role": "tool", "content": text, "tool_call_id": block.tool_use_id})
    if texts:
        joined = "\n".join(texts)
        chars += len(joined)
        out.append({"role": "user", "content": joined})
    return chars


def _assistant(m: MessageParam) -> dict[str, Any]:
    if isinstance(m.content, str):
        return {"role": "assistant", "content": m.content}
    texts, thoughts, calls = [], [], []
    for block in m.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append(template_call(block.id, block.name, block.input))
        else:
            assert isinstance(block, RedactedThinkingBlock)  # nothing readable to replay
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "\n".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def conversation(req: CountTokensRequest) -> Conversation:
    """The request's prompt part as the neutral conversation."""
    messages: list[dict[str, Any]] = []
    chars = 0
    if req.system:
        system = _text(req.system)
        chars += len(system)
        messages.append({"role": "system", "content": system})
    for m in req.messages:
        if m.role == "user":
            chars += _user(m, messages)
        elif m.role == "system":
            text = m.content if isinstance(m.content, str) else _text(m.content)
            chars += len(text)
            messages.append({"role": "system", "content": text})
        else:
            messages.append(_assistant(m))
    if req.messages[-1].role == "assistant":
        raise NotImplementedYet(
            "a final assistant message (prefill) is not implemented yet: end with a user turn",
            param="messages",
        )
    choice = req.tool_choice
    kind = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}[
        choice.type if choice else "auto"
    ]
    fmt = req.output_config.format if req.output_config else None
    thinking = req.thinking.type if req.thinking else None
    return Conversation(
        messages=tuple(messages),
        tools=tuple(
            Tool(
                t.name,
                t.input_schema,
                bool(t.strict),
                {
                    "type": "function",
                    "function": {
                        k: v
                        for k, v in (
                            ("name", t.name),
                            ("description", t.description),
                            ("parameters", t.input_schema),
                        )
                        if v is not None
                    },
                },
            )
            for t in req.tools or []
        ),
        tool_choice=ToolChoice(kind, choice.name if choice and kind == "named" else None),
        parallel_tool_calls=not (choice and choice.disable_parallel_tool_use),
        json_format=JsonFormat(
            fmt.json_schema, True, "output_config.format.schema", kind="json_schema"
        )
        if fmt is not None
        else None,
        template_kwargs={} if thinking is None else {"enable_thinking": thinking != "disabled"},
        verbatim_chars=chars,
    )


def messages_request(req: MessagesRequest) -> ApiRequest:
    """A Messages body as the neutral request. Tool calls come out whole (a `tool_use` block
    carries a parsed `input`): a call cut by max_tokens or malformed comes back as text."""
    return ApiRequest(
        prompt=conversation(req),
        max_tokens=req.max_tokens,
        sampling=SamplingFields(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k),
        stop=tuple(s for s in req.stop_sequences or () if s),
        whole_tool_calls=True,
    )
