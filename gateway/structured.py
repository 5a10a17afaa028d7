"""Structured output: `response_format` and `tool_choice` as the engine's `OutputConstraint`, and
the final check of constrained JSON.

The request is checked before any work is queued (an invalid or unsupported schema is a 400
naming the problem); the engine-specific parts (tool-call format, whether the answer may open
with a `<think>` block) are filled in once the prompt is rendered (`for_prompt`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import structlog
from llguidance import LLMatcher

from toolflash.engine.api import OutputConstraint, ReasoningMode, ToolSpec
from toolflash.engine.constraints.grammar import ConstraintError, build_grammar, check_schema
from toolflash.gateway.chat_output import ContentDelta, schema_errors
from toolflash.gateway.dialects.openai_request import chat_conversation
from toolflash.gateway.errors import BadRequest, EngineFailure, GatewayError
from toolflash.gateway.protocol import ChatCompletionRequest
from toolflash.gateway.request import Conversation, JsonFormat

log = structlog.get_logger(__name__)


def _bad(exc: ConstraintError, param: str) -> BadRequest:
    return BadRequest(str(exc), param=exc.param or param)


def _tool_specs(conv: Conversation, enforce_all: bool) -> tuple[ToolSpec, ...]:
    specs = []
    for t in conv.tools:
        if t.parameters and (t.strict or enforce_all):
            try:
                check_schema(t.parameters, t.strict, param="tools")
            except ConstraintError as exc:
                raise BadRequest(f"tool '{t.name}': {exc}", param="tools") from None
        specs.append(ToolSpec(t.name, t.parameters, t.strict))
    return tuple(specs)


def _json_constraint(fmt: JsonFormat | None) -> OutputConstraint | None:
    if fmt is None:
        return None
    if fmt.schema is None:
        return OutputConstraint("json")
    try:
        check_schema(fmt.schema, fmt.strict, param=fmt.param)
    except ConstraintError as exc:
        raise _bad(exc, fmt.param) from None
    return OutputConstraint("json", schema=dict(fmt.schema), strict=fmt.strict)


def build_constraint(req: ChatCompletionRequest | Conversation) -> OutputConstraint | None:
    """The constraint a conversation asks for, or None. Raises `BadRequest` for a schema that
    is invalid or uses keywords that cannot be enforced, and for forced tool calls without
    tools. (A chat completions body is accepted as such: benchmarks build constraints from
    the bodies they send.)"""
    conv = chat_conversation(req) if isinstance(req, ChatCompletionRequest) else req
    json_c = _json_constraint(conv.json_format)
    choice = conv.tool_choice
    forced = choice.kind in ("required", "named")
    if forced and not conv.tools:
        raise BadRequest(f"tool_choice {choice.kind} needs tools", param="tool_choice")
    if json_c is not None and forced:
        raise BadRequest(
            "response_format JSON and a forced tool_choice cannot be combined: the answer "
            "would have to be both a JSON document and a tool call",
            param="response_format",
        )
    parallel = conv.parallel_tool_calls
    if forced:
        tools = _tool_specs(conv, enforce_all=True)
        if choice.kind == "named":
            tools = tuple(t for t in tools if t.name == choice.name)
            parallel = False
        return OutputConstraint(
            "tool_calls", tools=tools, require_call=True, parallel_calls=parallel
        )
    tools = () if choice.kind == "none" else _tool_specs(conv, enforce_all=False)
    if json_c is not None:
        # JSON answer, or (tools offered, tool_choice auto) a well-formed tool call instead.
        return dataclasses.replace(json_c, tools=tools, parallel_calls=parallel)
    if any(t.strict for t in tools):
        return OutputConstraint(
            "tool_calls", tools=tools, require_call=False, parallel_calls=parallel
        )
    return None


def reasoning_mode(
    prompt_tail: str, enable_thinking: Any, start_in_reasoning: bool
) -> ReasoningMode:
    """How the constraint treats thinking: the prompt opened `<think>` ("open"); thinking is
    off or the prompt already closed the block ("none"); else the model may think first
    ("optional"). Reasoning is free text; only the answer after it is constrained."""
    if start_in_reasoning:
        return "open"
    if enable_thinking is False or prompt_tail.rstrip().endswith("</think>"):
        return "none"
    return "optional"


def for_prompt(
    constraint: OutputConstraint, tool_format: str, reasoning: ReasoningMode
) -> OutputConstraint:
    """`constraint` for the engine's tool-call format and the rendered prompt's reasoning
    state; raises `BadRequest` if it cannot be built (e.g. a `pattern` on a raw XML string)."""
    done = dataclasses.replace(constraint, tool_format=tool_format, reasoning=reasoning)
    try:
        grammar = build_grammar(done, lambda tag: False)
    except ConstraintError as exc:
        raise _bad(exc, "tools" if done.kind == "tool_calls" else "response_format") from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise BadRequest(f"constraint cannot be enforced: {error}", param="response_format")
    return done


@dataclass
class JsonCheck:
    """The final check of a constrained JSON answer (reported in the `toolflash` object)."""

    valid: bool
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "error": self.error}


def check_json(content: str, constraint: OutputConstraint) -> JsonCheck:
    """Parse `content` and validate it against the constraint's schema (any object for
    `json_object`) with jsonschema, independently of the grammar."""
    try:
        value = json.loads(content)
    except json.JSONDecodeError as exc:
        return JsonCheck(False, f"not valid JSON: {exc.msg} at char {exc.pos}")
    if constraint.schema is None:
        ok = isinstance(value, dict)
        return JsonCheck(ok, None if ok else "not a JSON object")
    errors = schema_errors(value, constraint.schema)
    return JsonCheck(not errors, "; ".join(errors) or None)


class JsonAnswer:
    """Collects the content of a constrained JSON answer and checks it at the end.

    Outcomes: valid, reported in `toolflash.structured_output`; invalid after finish_reason
    "length" (cut by max_tokens) or after a client stop string, or with `strict` false
    (keywords the grammar ignored), returned as generated and reported `valid: false`;
    invalid after a strict grammar finished on its own is a server fault (500, or an error
    event when streaming), never a silently invalid answer."""

    def __init__(self, constraint: OutputConstraint, stop_strings: tuple[str, ...]) -> None:
        self.constraint = constraint
        self.stop_strings = stop_strings
        self.content = ""
        self.check: JsonCheck | None = None

    def add(self, deltas: list[Any]) -> None:
        for d in deltas:
            if isinstance(d, ContentDelta):
                self.content += d.text

    def finish(self, finish_reason: str, tool_calls: int) -> GatewayError | None:
        """Check the answer; the error to raise when a strict answer failed its check."""
        if tool_calls and not self.content.strip():
            return None  # tools offered with tool_choice auto: the model called one instead
        self.check = check_json(self.content, self.constraint)
        if self.check.valid:
            return None
        log.warning("structured_output_invalid", finish=finish_reason, error=self.check.error)
        if finish_reason == "stop" and self.constraint.strict and not self.stop_strings:
            return EngineFailure(
                f"constrained output failed its final JSON check: {self.check.error}"
            )
        return None

    def as_dict(self) -> dict[str, Any] | None:
        return self.check.as_dict() if self.check is not None else None
