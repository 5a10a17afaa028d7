"""Structured output: `response_format` and `tool_choice` as the engine's `OutputConstraint`, and
the final check of constrained JSON.

The request is checked before any work is queued (an invalid or unsupported schema is a 400
naming the problem); the engine-specific parts (tool-call format, whether the answer may open
with a `<think>` block) are filled in once the prompt is rendered (`for_prompt`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from llguidance import LLMatcher

from toolflash.engine.api import OutputConstraint, ReasoningMode, ToolSpec
from toolflash.engine.constraints.grammar import ConstraintError, build_grammar, check_schema
from toolflash.gateway.chat_output import ContentDelta, schema_errors
from toolflash.gateway.errors import BadRequest, EngineFailure, GatewayError
from toolflash.gateway.protocol import ChatCompletionRequest, NamedToolChoice

log = structlog.get_logger(__name__)


def _bad(exc: ConstraintError, param: str) -> BadRequest:
    return BadRequest(str(exc), param=exc.param or param)


def _tool_specs(req: ChatCompletionRequest, enforce_all: bool) -> tuple[ToolSpec, ...]:
    specs = []
    for t in req.tools or []:
        fn = t.function
        strict = bool(fn.strict)
        if fn.parameters and (strict or enforce_all):
            try:
                check_schema(fn.parameters, strict, param="tools")
            except ConstraintError as exc:
                raise BadRequest(f"tool '{fn.name}': {exc}", param="tools") from None
        specs.append(ToolSpec(fn.name, fn.parameters, strict))
    return tuple(specs)


def _json_constraint(req: ChatCompletionRequest) -> OutputConstraint | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return OutputConstraint("json")
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
        # As OpenAI's: json_schema names its schema (json_object asks for any object).
        raise BadRequest(
            "response_format 'json_schema' needs json_schema.schema (use type 'json_object' "
            "for any JSON object)",
            param=f"{param}.schema",
        )
    strict = spec.get("strict") is True
    try:
        check_schema(schema, strict, param=f"{param}.schema")
    except ConstraintError as exc:
        raise _bad(exc, f"{param}.schema") from None
    return OutputConstraint("json", schema=dict(schema), strict=strict)


def build_constraint(req: ChatCompletionRequest) -> OutputConstraint | None:
    """The constraint `req` asks for, or None. Raises `BadRequest` for a schema that is invalid
    or uses keywords that cannot be enforced, and for forced tool calls without tools."""
    json_c = _json_constraint(req)
    choice = req.tool_choice
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    if forced and not req.tools:
        raise BadRequest(
            f"tool_choice {'required' if choice == 'required' else 'named'} needs tools",
            param="tool_choice",
        )
    if json_c is not None and forced:
        raise BadRequest(
            "response_format JSON and a forced tool_choice cannot be combined: the answer "
            "would have to be both a JSON document and a tool call",
            param="response_format",
        )
    parallel = req.parallel_tool_calls is not False
    if forced:
        tools = _tool_specs(req, enforce_all=True)
        if isinstance(choice, NamedToolChoice):
            tools = tuple(t for t in tools if t.name == choice.function.name)
            parallel = False
        return OutputConstraint(
            "tool_calls", tools=tools, require_call=True, parallel_calls=parallel
        )
    tools = () if choice == "none" else _tool_specs(req, enforce_all=False)
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
