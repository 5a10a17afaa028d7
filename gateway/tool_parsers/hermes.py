"""Hermes tool calls: `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>` (Qwen2.5/Qwen3).

Fast path: once `{"name": "<declared>", "arguments": {` is read, the arguments object streams raw
as the model writes it, its end found by brace matching outside strings (so a stray `<` of markup
inside the object marks it broken instead of leaking into the arguments). Any other layout
(arguments first, `parameters`, arguments as a JSON string) is buffered to `</tool_call>` and
parsed whole.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

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
)

_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_JSON_STRING_PREFIX = re.compile(r'"(?:[^"\\\n]|\\.)*\\?')
_STRING = object()
# The header the fast path recognises, as a sequence of tokens separated by optional whitespace.
_HEADER: tuple[object, ...] = ("{", '"name"', ":", _STRING, ",", '"arguments"', ":", "{")

HeaderMatch = tuple[Literal["ok", "more", "mismatch"], str | None, int]


def match_header(body: str) -> HeaderMatch:
    """Match the fast-path header at the start of a span body. Returns ("ok", name, index of the
    arguments' `{`), ("more", None, 0) if `body` may still become a header, else "mismatch"."""
    pos = 0
    name: str | None = None
    for step in _HEADER:
        while pos < len(body) and body[pos] in " \t\r\n":
            pos += 1
        if pos >= len(body):
            return "more", None, 0
        if step is _STRING:
            m = _JSON_STRING.match(body, pos)
            if m is None:
                if _JSON_STRING_PREFIX.fullmatch(body, pos):
                    return "more", None, 0
                return "mismatch", None, 0
            name = json.loads(m.group(0))
            pos = m.end()
            continue
        assert isinstance(step, str)
        frag = body[pos : pos + len(step)]
        if frag != step:
            if len(frag) < len(step) and step.startswith(frag):
                return "more", None, 0
            return "mismatch", None, 0
        pos += len(step)
    return "ok", name, pos - 1


def parse_call_object(text: str) -> tuple[str, dict[str, Any]] | None:
    """Parse a whole hermes call body into (name, arguments); None if it is not one."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], args


class HermesStream(SpanScanner):
    """Incremental hermes parser for one generation."""

    def _span_begin(self) -> None:
        self._body = ""
        self._state = "header"
        self._pos = 0
        self._name = ""
        self._index = -1
        self._args = ""
        self._depth = 0
        self._in_str = False
        self._esc = False

    def _span_feed(self, text: str, out: list[Piece]) -> int | None:
        base = len(self._body)
        self._body += text
        end = self._advance(out)
        return None if end is None else end - base

    def _advance(self, out: list[Piece]) -> int | None:
        """Run the span state machine as far as the body allows; the body index just after the
        span's end tag once it ended."""
        while True:
            body = self._body
            if self._state == "header":
                status, name, brace = match_header(body)
                if status == "more":
                    j = body.find(END_TAG)
                    return None if j < 0 else self._finish_whole(j, out)
                if status == "mismatch":
                    self._state = "whole"
                    continue
                assert name is not None
                self._name = name
                if name not in self.tools:
                    self._state = "reject"
                    continue
                self._index = self._new_call(name, out)
                self._state, self._pos = "args", brace
                continue
            if self._state == "args":
                if not self._scan_args(out):
                    return None
                continue
            j = body.find(END_TAG, self._pos)
            if j < 0:
                return None
            if self._state == "whole":
                return self._finish_whole(j, out)
            if self._state == "reject":
                out.append(
                    SpanRejected(START_TAG + body[:j] + END_TAG, "undeclared_tool", self._name)
                )
            elif self._state == "broken":
                self._close(out, "markup inside the arguments object", j)
            else:  # "tail": the arguments object ended; expect the call object to close
                self._close_tail(body[self._pos : j], body[:j], out, j)
            return j + len(END_TAG)

    def _scan_args(self, out: list[Piece]) -> bool:
        """Stream the arguments object; True once it ended (or broke), False if more is needed."""
        body, i, start = self._body, self._pos, self._pos
        done = False
        while i < len(body):
            c = body[i]
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
            elif c == '"':
                self._in_str = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    i += 1
                    self._state = "tail"
                    done = True
                    break
            elif c == "<":
                self._state = "broken"
                done = True
                break
            i += 1
        if i > start:
            frag = body[start:i]
            self._args += frag
            out.append(CallArguments(self._index, frag))
        self._pos = i
        return done

    def _close(self, out: list[Piece], error: str | None, end: int | None = None) -> None:
        """Close the call; a failed one carries its span's text (`end`: where the end tag
        starts in the body; None: the generation ended inside the span)."""
        raw = ""
        if error is not None:
            raw = START_TAG + (self._body if end is None else self._body[:end] + END_TAG)
        out.append(CallClosed(self._index, self._name, self._args, error is None, error, raw))

    def _close_tail(self, tail: str, whole: str, out: list[Piece], end: int | None = None) -> None:
        try:
            args = json.loads(self._args)
        except json.JSONDecodeError as exc:
            self._close(out, f"arguments are not valid JSON: {exc.msg}", end)
            return
        if tail.strip() in ("}", ""):
            error = None if isinstance(args, dict) else "arguments are not an object"
            self._close(out, error, end)
            return
        parsed = parse_call_object(whole)
        ok = parsed is not None and parsed == (self._name, args)
        self._close(out, None if ok else "unexpected text after the arguments", end)

    def _finish_whole(self, j: int, out: list[Piece]) -> int:
        """Parse a buffered span whole (no fast-path header); `j` is where its end tag starts."""
        inner = self._body[:j]
        self._emit_whole(inner, START_TAG + inner + END_TAG, "malformed", out)
        return j + len(END_TAG)

    def _emit_whole(self, inner: str, raw: str, failure: str, out: list[Piece]) -> None:
        parsed = parse_call_object(inner)
        if parsed is None:
            out.append(SpanRejected(raw, failure))
            return
        name, args = parsed
        if name not in self.tools:
            out.append(SpanRejected(raw, "undeclared_tool", name))
            return
        self._name = name
        self._index = self._new_call(name, out)
        self._args = json.dumps(args, ensure_ascii=False)
        out.append(CallArguments(self._index, self._args))
        self._close(out, None)

    def _span_finish(self, out: list[Piece]) -> None:
        body = self._body
        if self._state in ("header", "whole"):
            # The model may stop right after the object without the end tag.
            self._emit_whole(body, START_TAG + body, "truncated", out)
        elif self._state == "reject":
            out.append(SpanRejected(START_TAG + body, "undeclared_tool", self._name))
        elif self._state == "args":
            out.append(
                CallClosed(
                    self._index, self._name, self._args, False, "truncated", START_TAG + body
                )
            )
        elif self._state == "broken":
            self._close(out, "markup inside the arguments object")
        else:
            self._close_tail(body[self._pos :], body, out)


class HermesParser(FoldingParser):
    """The `hermes` tool-call format."""

    name = "hermes"

    def stream(self, tools: ToolSchemas) -> ToolCallStream:
        return HermesStream(tools)
