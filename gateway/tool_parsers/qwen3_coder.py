"""Qwen3-Coder XML tool calls.

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

Arguments are built as a JSON object `{"ARG": value, ...}`. A parameter the tool's schema types as
a string (or does not declare) streams character by character as a JSON string; other values are
buffered to `</parameter>` and converted with `json.loads` (kept as a string when that fails, so
the schema check reports the mismatch instead of the parser dropping text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from toolflash.gateway.tool_parsers.base import (
    END_TAG,
    START_TAG,
    CallArguments,
    CallClosed,
    FoldingParser,
    Piece,
    SpanRejected,
    SpanScanner,
    ToolCallStream,
    ToolSchemas,
    partial_suffix,
)

_FUNCTION = re.compile(r"\s*<function=([^>\n<]+)>")
_FUNCTION_PREFIX = re.compile(
    r"\s*(?:<(?:f(?:u(?:n(?:c(?:t(?:i(?:o(?:n(?:=[^>\n<]*)?)?)?)?)?)?)?)?)?)?"
)
_PARAMETER = re.compile(r"<parameter=([^>\n<]+)>")
_PARAM_OPEN = "<parameter="
_PARAM_CLOSE = "</parameter>"
_FUNC_CLOSE = "</function>"


def _escape(text: str) -> str:
    """JSON string escaping without quotes; per-character, so chunks concatenate exactly."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _param_type(schema: Mapping[str, Any] | None, key: str) -> tuple[bool, Any]:
    """(declared, JSON-schema type) of a parameter."""
    props = (schema or {}).get("properties")
    if not isinstance(props, Mapping) or not isinstance(props.get(key), Mapping):
        return False, None
    return True, props[key].get("type")


def convert_value(text: str, declared_type: Any) -> Any:
    """Convert a buffered non-string parameter value to JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    if declared_type == "boolean" and text.strip() in ("True", "False"):
        return text.strip() == "True"
    return text


class Qwen3CoderStream(SpanScanner):
    """Incremental Qwen3-Coder XML parser for one generation."""

    def _span_begin(self) -> None:
        self._body = ""
        self._state = "header"
        self._pos = 0
        self._name = ""
        self._index = -1
        self._args = ""
        self._first = True
        self._key = ""
        self._as_string = False
        self._value_start = -1
        self._value_type: Any = None

    def _span_feed(self, text: str, out: list[Piece]) -> int | None:
        base = len(self._body)
        self._body += text
        end = self._advance(out)
        return None if end is None else end - base

    def _emit(self, fragment: str, out: list[Piece]) -> None:
        if fragment:
            self._args += fragment
            out.append(CallArguments(self._index, fragment))

    def _advance(self, out: list[Piece]) -> int | None:
        while True:
            body = self._body
            if self._state == "header":
                m = _FUNCTION.match(body)
                if m is None:
                    if _FUNCTION_PREFIX.fullmatch(body):
                        return None
                    self._state = "reject"
                    continue
                self._name = m.group(1).strip()
                if self._name not in self.tools:
                    self._state = "reject"
                    continue
                self._index = self._new_call(self._name, out)
                self._emit("{", out)
                self._state, self._pos = "params", m.end()
                continue
            if self._state == "params":
                pos = self._pos
                while pos < len(body) and body[pos] in " \t\r\n":
                    pos += 1
                self._pos = pos
                rest = body[pos:]
                m = _PARAMETER.match(body, pos)
                if m is not None:
                    self._open_value(m.group(1).strip(), m.end())
                    continue
                if rest.startswith(_FUNC_CLOSE):
                    self._emit("}", out)
                    self._state, self._pos = "tail", pos + len(_FUNC_CLOSE)
                    continue
                if rest.startswith(END_TAG):
                    self._close(out, "missing </function>", pos)
                    return pos + len(END_TAG)
                if (
                    not rest
                    or any(t.startswith(rest) for t in (_PARAM_OPEN, _FUNC_CLOSE, END_TAG))
                    or (rest.startswith(_PARAM_OPEN) and ">" not in rest and "\n" not in rest)
                ):
                    return None
                self._state = "broken"
                continue
            if self._state == "value":
                if not self._scan_value(out):
                    return None
                continue
            j = body.find(END_TAG, self._pos)
            if j < 0:
                return None
            if self._state == "reject":
                raw = START_TAG + body[:j] + END_TAG
                reason = "undeclared_tool" if self._name else "malformed"
                out.append(SpanRejected(raw, reason, self._name or None))
            elif self._state == "broken":
                self._close(out, "unexpected text between parameters", j)
            else:  # "tail": after </function>
                self._close(out, None)
            return j + len(END_TAG)

    def _open_value(self, key: str, pos: int) -> None:
        declared, vtype = _param_type(self.tools.get(self._name), key)
        self._key = key
        self._value_type = vtype
        self._as_string = vtype == "string" or not declared
        self._state, self._pos, self._value_start = "value", pos, -1

    def _scan_value(self, out: list[Piece]) -> bool:
        """Advance inside a parameter value; True once `</parameter>` closed it."""
        body = self._body
        if self._value_start < 0:
            if self._pos >= len(body):
                return False
            if body[self._pos] == "\n":  # the template puts the value on its own line
                self._pos += 1
            self._value_start = self._pos
            if self._as_string:
                sep = "" if self._first else ", "
                self._emit(f'{sep}{json.dumps(self._key, ensure_ascii=False)}: "', out)
        j = body.find(_PARAM_CLOSE, self._pos)
        if j < 0:
            if self._as_string:
                rest = body[self._pos :]
                keep = max(
                    partial_suffix(rest, "\n" + _PARAM_CLOSE), partial_suffix(rest, _PARAM_CLOSE)
                )
                safe = len(body) - keep
                self._emit(_escape(body[self._pos : safe]), out)
                self._pos = safe
            return False
        end = j - 1 if j - 1 >= self._value_start and body[j - 1] == "\n" else j
        if self._as_string:
            self._emit(_escape(body[self._pos : end]) + '"', out)
        else:
            value = convert_value(body[self._value_start : end], self._value_type)
            sep = "" if self._first else ", "
            key = json.dumps(self._key, ensure_ascii=False)
            self._emit(f"{sep}{key}: {json.dumps(value, ensure_ascii=False)}", out)
        self._first = False
        self._state, self._pos = "params", j + len(_PARAM_CLOSE)
        return True

    def _close(self, out: list[Piece], error: str | None, end: int | None = None) -> None:
        """Close the call; a failed one carries its span's text (`end`: where the end tag
        starts in the body; None: the generation ended inside the span)."""
        raw = ""
        if error is not None:
            raw = START_TAG + (self._body if end is None else self._body[:end] + END_TAG)
        out.append(CallClosed(self._index, self._name, self._args, error is None, error, raw))

    def _span_finish(self, out: list[Piece]) -> None:
        if self._state == "header" or self._state == "reject":
            reason = "undeclared_tool" if self._name else "truncated"
            out.append(SpanRejected(START_TAG + self._body, reason, self._name or None))
        elif self._state == "tail":
            self._close(out, None)
        elif self._state == "broken":
            self._close(out, "unexpected text between parameters")
        else:
            raw = START_TAG + self._body
            out.append(CallClosed(self._index, self._name, self._args, False, "truncated", raw))


class Qwen3CoderParser(FoldingParser):
    """The `qwen3_coder` tool-call format."""

    name = "qwen3_coder"

    def stream(self, tools: ToolSchemas) -> ToolCallStream:
        return Qwen3CoderStream(tools)
