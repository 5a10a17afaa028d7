"""OpenAI Responses request -> the neutral `ApiRequest` (pure: no engine, no starlette).

Items become the chat template's messages: `instructions` and the system / developer messages
before the first other item one system message (joined by blank lines; templates take one
system message, first); later system / developer messages stay system messages (the template
decides); user messages user turns; consecutive assistant output (messages, `reasoning` items,
`function_call` items) one assistant turn with its content, reasoning and tool calls;
`function_call_output` one tool message each. `reasoning.effort` none turns the model's
thinking off, any other effort on. Nothing is stored (store: false semantics), so fields that
refer to stored state are refused with a 400 saying so.
"""

from __future__ import annotations

from typing import Any

from toolflash.gateway.dialects.openai_request import template_call
from toolflash.gateway.dialects.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    HostedTool,
    MessageItem,
    NamedFunctionChoice,
    ReasoningItem,
    ResponsesRequest,
    TextFormat,
    function_tools,
)
from toolflash.gateway.errors import BadRequest, NotImplementedYet
from toolflash.gateway.request import (
    ApiRequest,
    Conversation,
    JsonFormat,
    SamplingFields,
    Tool,
    ToolChoice,
)

# `include` values that need nothing more than what every response has.
_INCLUDES = frozenset({"reasoning.encrypted_content"})


def hosted_tools(req: ResponsesRequest) -> list[str]:
    """The hosted tools the request lists (not offered to the model: they cannot run here), as
    `toolflash.ignored_fields` names them."""
    return [
        f"tools[{i}] ({t.type})" for i, t in enumerate(req.tools or []) if isinstance(t, HostedTool)
    ]


def check_responses_supported(req: ResponsesRequest) -> None:
    """A 400 for fields that need stored state or features not implemented here (never a
    silent ignore)."""
    extra = req.model_extra or {}
    if req.previous_response_id is not None:
        raise BadRequest(
            "previous_response_id is not supported: this server stores no responses (store: "
            "false semantics); send the whole conversation in 'input' (earlier output items "
            "and function_call_output items included)",
            param="previous_response_id",
            code="unsupported_parameter",
        )
    if extra.get("conversation") is not None:
        raise NotImplementedYet(
            "conversation is not supported: this server stores no conversations; send the "
            "whole conversation in 'input'",
            param="conversation",
        )
    if extra.get("background"):
        raise NotImplementedYet(
            "background responses are not supported (they need stored responses)",
            param="background",
        )
    if extra.get("prompt") is not None:
        raise NotImplementedYet(
            "prompt (a stored prompt template) is not supported: send instructions and input",
            param="prompt",
        )
    if extra.get("truncation") not in (None, "disabled"):
        raise NotImplementedYet(
            "truncation 'auto' is not implemented: a conversation that does not fit the "
            "context is a 400 (context_length_exceeded)",
            param="truncation",
        )
    if extra.get("max_tool_calls") is not None:
        raise NotImplementedYet(
            "max_tool_calls is not implemented (parallel_tool_calls false allows one call)",
            param="max_tool_calls",
        )
    if extra.get("top_logprobs"):
        raise NotImplementedYet("top_logprobs is not implemented yet", param="top_logprobs")
    for i, name in enumerate(req.include or []):
        if name not in _INCLUDES:
            raise NotImplementedYet(
                f"include '{name}' is not supported (supported: {', '.join(sorted(_INCLUDES))})",
                param=f"include[{i}]",
            )


class _Turns:
    """Builds the template's messages from items, merging a run of assistant output."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.system: list[str] = []  # instructions and the leading system / developer text
        self.leading = True
        self.chars = 0  # characters every template renders verbatim
        self._assistant: dict[str, Any] | None = None

    def _add(self, message: dict[str, Any]) -> None:
        self._assistant = None
        self.leading = False
        self.messages.append(message)

    def _turn(self) -> dict[str, Any]:
        """The assistant turn replayed output joins (a new one after any other message)."""
        if self._assistant is None:
            self.leading = False
            self._assistant = {"role": "assistant", "content": ""}
            self.messages.append(self._assistant)
        return self._assistant

    def message(self, m: MessageItem) -> None:
        text = m.text
        if m.role in ("system", "developer"):
            self.chars += len(text)
            if self.leading:
                self.system.append(text)
            else:
                self._add({"role": "system", "content": text})
        elif m.role == "user":
            self.chars += len(text)
            self._add({"role": "user", "content": text})
        else:
            self._turn()["content"] += text

    def reasoning(self, item: ReasoningItem) -> None:
        turn = self._turn()
        prior = turn.get("reasoning_content")
        turn["reasoning_content"] = f"{prior}\n{item.text}" if prior else item.text

    def call(self, item: FunctionCallItem) -> None:
        calls = self._turn().setdefault("tool_calls", [])
        calls.append(template_call(item.call_id, item.name, item.arguments))

    def output(self, item: FunctionCallOutputItem) -> None:
        text = item.text
        self.chars += len(text)
        self._add({"role": "tool", "content": text, "tool_call_id": item.call_id})

    def result(self) -> tuple[dict[str, Any], ...]:
        head = [{"role": "system", "content": "\n\n".join(self.system)}] if self.system else []
        return tuple(head + self.messages)


def template_messages(req: ResponsesRequest) -> tuple[tuple[dict[str, Any], ...], int]:
    """The conversation as template messages, and the characters rendered verbatim."""
    turns = _Turns()
    if req.instructions:
        turns.system.append(req.instructions)
        turns.chars += len(req.instructions)
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else []
    for item in items or req.input:
        if isinstance(item, MessageItem):
            turns.message(item)
        elif isinstance(item, ReasoningItem):
            turns.reasoning(item)
        elif isinstance(item, FunctionCallItem):
            turns.call(item)
        else:
            assert isinstance(item, FunctionCallOutputItem)
            turns.output(item)
    messages = turns.result()
    if not any(m["role"] in ("user", "tool") for m in messages):
        raise BadRequest("input has no user message or function_call_output", param="input")
    if messages[-1]["role"] == "assistant":
        raise NotImplementedYet(
            "input ending with assistant output (a prefill) is not implemented: end with a "
            "user message or a function_call_output",
            param="input",
        )
    return messages, turns.chars


def json_format(fmt: TextFormat | None) -> JsonFormat | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return JsonFormat(param="text.format")
    assert fmt.json_schema is not None  # the protocol requires it
    return JsonFormat(
        dict(fmt.json_schema), fmt.strict is True, "text.format.schema", kind="json_schema"
    )


def _tool_choice(choice: Any) -> ToolChoice:
    if isinstance(choice, NamedFunctionChoice):
        return ToolChoice("named", choice.name)
    return ToolChoice(choice or "auto")


def thinking_switch(req: ResponsesRequest) -> dict[str, Any]:
    """The template's thinking switch: effort none off, any other on, absent the default."""
    effort = req.reasoning.effort if req.reasoning else None
    return {} if effort is None else {"enable_thinking": effort != "none"}


def conversation(req: ResponsesRequest) -> Conversation:
    messages, chars = template_messages(req)
    fmt = req.text.format if req.text else None
    return Conversation(
        messages=messages,
        tools=tuple(
            Tool(
                t.name,
                t.parameters,
                bool(t.strict),
                # As the client sent it (chat completions' shape): what chat renders for the
                # same tool, so both routes give the model the same prompt.
                {
                    "type": "function",
                    "function": t.model_dump(
                        exclude_unset=True, exclude_none=True, exclude={"type"}
                    ),
                },
            )
            for t, _ in function_tools(req.tools)
        ),
        tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        json_format=json_format(fmt),
        template_kwargs=thinking_switch(req),
        verbatim_chars=chars,
    )


def responses_request(req: ResponsesRequest) -> ApiRequest:
    """A Responses body as the neutral request. Function calls come out whole: a
    `function_call` item always carries arguments that parsed for a declared tool; a call cut
    by max_output_tokens or malformed comes back as text."""
    return ApiRequest(
        prompt=conversation(req),
        max_tokens=req.max_output_tokens,
        sampling=SamplingFields(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
        ),
        whole_tool_calls=True,
    )
