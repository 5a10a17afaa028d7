"""Turn a generation's text into OpenAI message deltas: reasoning, content and tool calls.

One `ChatOutput` per generation. `feed(text)` returns the deltas that text completes; the
non-streaming message is the fold of the same deltas (`MessageFold`), so a stream and a plain
response always agree. Tool calls are checked against the tool's JSON schema when they close.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from toolflash.gateway.reasoning import ReasoningSplitter
from toolflash.gateway.tool_parsers import (
    CallArguments,
    CallClosed,
    CallHeader,
    SpanRejected,
    TextPiece,
    ToolCallStream,
    ToolParser,
    ToolSchemas,
)


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A tool-call delta: the first one of a call carries `id` and `name`."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


Delta = ReasoningDelta | ContentDelta | ToolCallDelta


@dataclass
class ToolCallReport:
    """How one emitted tool call turned out (reported in the response's `toolflash` object)."""

    index: int
    name: str
    parsed: bool
    error: str | None = None
    schema_valid: bool | None = None
    schema_errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "parsed": self.parsed,
            "error": self.error,
            "schema_valid": self.schema_valid,
            "schema_errors": self.schema_errors,
        }


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def schema_errors(arguments: Any, schema: Mapping[str, Any] | None, limit: int = 5) -> list[str]:
    """Messages of the JSON-schema violations of `arguments` (empty when valid or no schema)."""
    if not schema:
        return []
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in errors[:limit]
    ]


class ChatOutput:
    """Incremental assembler for one chat generation."""

    def __init__(
        self,
        *,
        parser: ToolParser | None,
        tools: ToolSchemas,
        start_in_reasoning: bool,
        parallel_tool_calls: bool = True,
        id_factory: Callable[[], str] = new_call_id,
        hold_calls: bool = False,
    ) -> None:
        """`hold_calls` (forced calls): a call's deltas go out only once it closed, so a call
        cut by max_tokens comes back as its text in `content` (finish `length`) instead of a
        call with partial arguments; streamed or not, the message is the same."""
        self._reasoning = ReasoningSplitter(start_in_reasoning=start_in_reasoning)
        self._tools = tools
        self._calls: ToolCallStream | None = parser.stream(tools) if parser and tools else None
        self._parallel = parallel_tool_calls
        self._id_factory = id_factory
        self._ids: dict[int, str] = {}
        self.reports: list[ToolCallReport] = []
        self.rejected: list[dict[str, Any]] = []
        self.stop_requested = False
        # The text fed while none of it reached a delta yet (kept only until some did, so a
        # long stream does not copy its whole text at every token): a generation cut before
        # anything showed (an empty `<think>` opening, a forced call's first tokens) still
        # returns what it has.
        self._raw = ""
        self._shown = False
        self._hold = hold_calls
        self._held: dict[int, list[Delta]] = {}

    def results(self) -> tuple[str, ...]:
        """How each tool-call span turned out, for metrics."""
        out: list[str] = []
        for r in self.reports:
            if not r.parsed:
                out.append("truncated" if r.error == "truncated" else "malformed")
            else:
                out.append("valid" if r.schema_valid is not False else "schema_invalid")
        out += [str(r["reason"]) for r in self.rejected]
        return tuple(out)

    @property
    def valid_calls(self) -> int:
        return sum(1 for r in self.reports if r.parsed)

    @property
    def can_stop(self) -> bool:
        """parallel_tool_calls false with tools: the first call that parses stops it."""
        return self._calls is not None and not self._parallel

    def feed(self, text: str) -> list[Delta]:
        if self.stop_requested or not text:
            return []
        if not self._shown:
            self._raw += text
        return self._seen(self._route(self._reasoning.feed(text), final=False))

    def close(self) -> list[Delta]:
        """The deltas the end of the text completes. A message is never empty: when nothing
        generated showed as reasoning, content or a call (a cut generation: max_tokens inside
        the `<think>` glue or a forced call's opening tag), the raw text is its content."""
        if self.stop_requested:
            return []
        out = self._seen(self._route(self._reasoning.close(), final=True))
        if not self._shown and self._raw.strip():
            out.append(ContentDelta(self._raw))
            self._shown = True
        return out

    def _seen(self, deltas: list[Delta]) -> list[Delta]:
        if deltas:
            self._shown = True
        return deltas

    def _route(self, segments: list[tuple[str, str]], *, final: bool) -> list[Delta]:
        out: list[Delta] = []
        for channel, text in segments:
            if channel == "reasoning":
                out.append(ReasoningDelta(text))
            elif self._calls is None:
                out.append(ContentDelta(text))
            else:
                self._pieces(self._calls.feed(text), out)
            if self.stop_requested:
                return out
        if final and self._calls is not None:
            self._pieces(self._calls.close(), out)
        return out

    def _pieces(self, pieces: list[Any], out: list[Delta]) -> None:
        for p in pieces:
            if self.stop_requested:
                return
            if isinstance(p, TextPiece):
                out.append(ContentDelta(p.text))
            elif isinstance(p, SpanRejected):
                out.append(ContentDelta(p.raw))
                self.rejected.append({"reason": p.reason, "name": p.name, "chars": len(p.raw)})
            elif isinstance(p, CallHeader):
                call_id = self._ids[p.index] = self._id_factory()
                self._call_delta(ToolCallDelta(p.index, "", id=call_id, name=p.name), out)
            elif isinstance(p, CallArguments):
                self._call_delta(ToolCallDelta(p.index, p.fragment), out)
            elif isinstance(p, CallClosed):
                held = self._held.pop(p.index, [])
                if self._hold and not p.ok and p.raw:
                    out.append(ContentDelta(p.raw))  # cut: what it has, as text
                else:
                    out.extend(held)
                self._closed(p)

    def _call_delta(self, delta: ToolCallDelta, out: list[Delta]) -> None:
        if self._hold:
            self._held.setdefault(delta.index, []).append(delta)
        else:
            out.append(delta)

    def _closed(self, p: CallClosed) -> None:
        report = ToolCallReport(p.index, p.name, p.ok, p.error)
        if p.ok:
            args = json.loads(p.arguments)
            errors = schema_errors(args, self._tools.get(p.name))
            report.schema_valid = not errors
            report.schema_errors = errors
        self.reports.append(report)
        if p.ok and not self._parallel:
            self.stop_requested = True


@dataclass
class MessageFold:
    """Accumulates deltas into the non-streaming message (and checks stream reassembly)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, deltas: list[Delta]) -> None:
        for d in deltas:
            if isinstance(d, ReasoningDelta):
                self.reasoning += d.text
            elif isinstance(d, ContentDelta):
                self.content += d.text
            else:
                call = self.tool_calls.setdefault(
                    d.index,
                    {"id": d.id, "type": "function", "function": {"name": d.name, "arguments": ""}},
                )
                call["function"]["arguments"] += d.arguments

    def message(self) -> dict[str, Any]:
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return {
            "role": "assistant",
            "content": self.content if (self.content or not calls) else None,
            "reasoning_content": self.reasoning or None,
            "tool_calls": calls or None,
        }
