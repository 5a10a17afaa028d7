"""What goes to an upstream and what comes back, as pure functions: the neutral request as an
OpenAI chat-completions body, and the upstream's stream chunks as raw model text.

An OpenAI-compatible server returns reasoning and tool calls either parsed (`reasoning_content`,
`tool_calls` deltas) or as raw text in `content`. Both become one raw text in the model's own
spelling (`<think>...</think>`, Hermes `<tool_call>` blocks), which the gateway's own reasoning
splitter and tool-call parser then read: one parse and one schema check, whatever the upstream
did, and the same output path as the local engine's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolflash.gateway.errors import BadRequest
from toolflash.gateway.request import ApiRequest, Conversation


def _wire_message(m: Mapping[str, Any]) -> dict[str, Any]:
    """A template-shaped message as OpenAI's wire shape (tool-call arguments as strings)."""
    out = dict(m)
    calls = out.get("tool_calls")
    if calls:
        wired = []
        for call in calls:
            fn = dict(call.get("function", {}))
            args = fn.get("arguments")
            if not isinstance(args, str):
                fn["arguments"] = json.dumps(args if args is not None else {})
            wired.append({**call, "type": "function", "function": fn})
        out["tool_calls"] = wired
    return out


def _tool_choice(conv: Conversation) -> str | dict[str, Any]:
    choice = conv.tool_choice
    if choice.kind == "named":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.kind


def chat_body(req: ApiRequest, model: str, max_tokens: int) -> dict[str, Any]:
    """The chat-completions body for an upstream (streamed, with usage)."""
    conv = req.conversation
    if conv is None:
        raise BadRequest(
            "raw-text completions are not routed to upstream pools; use /v1/chat/completions",
            param="prompt",
        )
    body: dict[str, Any] = {
        "model": model,
        "messages": [_wire_message(m) for m in conv.messages],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if conv.tools:
        body["tools"] = [dict(t.template) for t in conv.tools]
        body["tool_choice"] = _tool_choice(conv)
        body["parallel_tool_calls"] = conv.parallel_tool_calls
    fmt = conv.json_format
    if fmt is not None:
        body["response_format"] = (
            {"type": "json_object"}
            if fmt.schema is None
            else {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": dict(fmt.schema), "strict": fmt.strict},
            }
        )
    if conv.template_kwargs:
        body["chat_template_kwargs"] = dict(conv.template_kwargs)
    s = req.sampling
    for key in ("temperature", "top_p", "top_k", "min_p", "seed"):
        value = getattr(s, key)
        if value is not None:
            body[key] = value
    for key in ("frequency_penalty", "presence_penalty"):
        value = getattr(s, key)
        if value:
            body[key] = value
    if s.logit_bias:
        body["logit_bias"] = dict(s.logit_bias)
    if req.stop:
        body["stop"] = list(req.stop)
    return body


class SseEvents:
    """An upstream's SSE body -> the JSON objects of its `data:` lines, a network read at a time
    (`feed` returns every event the read completed, so a burst of chunks costs one pass, not
    one async step each); `done` once `[DONE]` came (what follows it is ignored)."""

    def __init__(self) -> None:
        self._rest = b""
        self.done = False

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        if self.done:
            return []
        *lines, self._rest = (self._rest + data).split(b"\n")
        return self._parse(lines)

    def close(self) -> list[dict[str, Any]]:
        """The events of a last line with no newline (a body that ended without one)."""
        rest, self._rest = self._rest, b""
        return [] if self.done or not rest else self._parse([rest])

    def _parse(self, lines: list[bytes]) -> list[dict[str, Any]]:
        out = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                break
            try:
                obj = json.loads(data)
            except ValueError:
                raise MalformedEvent(data[:200].decode(errors="replace")) from None
            if isinstance(obj, dict):
                out.append(obj)
        return out


class MalformedEvent(ValueError):
    """An upstream `data:` line that is not JSON (its first 200 characters)."""


def error_text(obj: Mapping[str, Any]) -> str | None:
    """An upstream error event's message (None: not an error)."""
    err = obj.get("error")
    if err is None:
        return None
    return str(err.get("message", err)) if isinstance(err, Mapping) else str(err)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class ChunkText:
    """Upstream chunks -> the model's raw text (`feed` per chunk, `close` at the end)."""

    def __init__(self) -> None:
        self._reasoning = False  # inside <think>
        self._call: int | None = None  # index of the open tool call
        self._args = 0  # characters of its arguments so far
        self.finish_reason: str | None = None
        self.usage: Usage | None = None

    def feed(self, chunk: Mapping[str, Any]) -> str:
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            details = usage.get("prompt_tokens_details") or {}
            self.usage = Usage(
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
                int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0,
            )
        out = ""
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                out += self._close_call()
                if not self._reasoning:
                    out += "<think>\n"
                    self._reasoning = True
                out += thought
            content = delta.get("content")
            if content:
                out += self._end_reasoning() + self._close_call() + content
            for call in delta.get("tool_calls") or ():
                out += self._end_reasoning() + self._call_text(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def close(self) -> str:
        return self._end_reasoning() + self._close_call()

    def _end_reasoning(self) -> str:
        if not self._reasoning:
            return ""
        self._reasoning = False
        return "\n</think>\n\n"

    def _call_text(self, call: Mapping[str, Any]) -> str:
        out = ""
        index = call.get("index", 0)
        fn = call.get("function") or {}
        if index != self._call:
            out += self._close_call()
            self._call = index
            self._args = 0
            out += '<tool_call>\n{"name": ' + json.dumps(fn.get("name") or "") + ', "arguments": '
        args = fn.get("arguments") or ""
        self._args += len(args)
        return out + args

    def _close_call(self) -> str:
        if self._call is None:
            return ""
        self._call = None
        return ("" if self._args else "{}") + "}\n</tool_call>"


def finish(upstream_reason: str | None) -> str:
    """The upstream's finish reason as the engine's ("length" or "stop": tool calls are the
    gateway's own finding)."""
    return "length" if upstream_reason == "length" else "stop"
