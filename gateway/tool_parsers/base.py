"""What every tool-call parser emits, the `ToolParser` protocol, and the shared content scanner.

A parser turns the model's content text into *pieces*: plain text, and tool calls announced by a
header, argument fragments and a close record. The streaming entry (`stream(tools).feed/close`) is
the definition; the complete entry folds it, so a non-streaming response is exactly the
concatenation of what a stream would have sent, however the text was chunked.

Rules shared by all formats (see design-notes: what agent clients do with bad tool turns):
- a call's header is emitted only once its name is parsed and declared; an undeclared name or an
  unparsable opening returns the whole raw span as text (`SpanRejected`), never half of it;
- after the header, arguments stream as they are validated; a span that breaks later (or is cut by
  the end of generation) is closed with `ok=False` so callers can flag it and not finish with
  "tool_calls";
- whitespace directly around a call is dropped (it is template glue, not text); a rejected
  span keeps it, so a generation without calls comes back exactly as the model wrote it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

START_TAG = "<tool_call>"
END_TAG = "</tool_call>"

# Declared tool name -> its JSON-schema `parameters` (None when the tool declares none).
ToolSchemas = Mapping[str, Mapping[str, Any] | None]


@dataclass(frozen=True)
class TextPiece:
    """Plain content text."""

    text: str


@dataclass(frozen=True)
class CallHeader:
    """A tool call starts: its index among emitted calls and its (declared) name."""

    index: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next fragment of a call's JSON arguments text."""

    index: int
    fragment: str


@dataclass(frozen=True)
class CallClosed:
    """A call ended. `arguments` equals the concatenated fragments; `ok` says whether the span
    parsed completely (schema validity is checked by the caller)."""

    index: int
    name: str
    arguments: str
    ok: bool
    error: str | None = None
    # A call that failed (`ok` False: cut before its end, or malformed): the span's text, tags
    # included, so a caller that held the call back can return it as content (forced calls,
    # dialects that only emit whole calls).
    raw: str = field(default="", compare=False)


@dataclass(frozen=True)
class SpanRejected:
    """A tool-call span that is returned as content, whole (`raw` includes its tags)."""

    raw: str
    reason: str  # "undeclared_tool" | "malformed" | "truncated"
    name: str | None = None


Piece = TextPiece | CallHeader | CallArguments | CallClosed | SpanRejected


class ToolCallStream(Protocol):
    """Incremental entry: feed content text as it is generated, then close once."""

    def feed(self, text: str) -> list[Piece]: ...

    def close(self) -> list[Piece]: ...


class ToolParser(Protocol):
    """One tool-call format, with an incremental and a complete entry."""

    name: str

    def stream(self, tools: ToolSchemas) -> ToolCallStream: ...

    def parse(self, text: str, tools: ToolSchemas) -> list[Piece]: ...


def coalesce(pieces: list[Piece]) -> list[Piece]:
    """Merge adjacent text pieces and adjacent argument fragments of the same call, so that two
    piece lists can be compared independently of how the text was chunked."""
    out: list[Piece] = []
    for p in pieces:
        last = out[-1] if out else None
        if isinstance(p, TextPiece) and isinstance(last, TextPiece):
            out[-1] = TextPiece(last.text + p.text)
        elif (
            isinstance(p, CallArguments)
            and isinstance(last, CallArguments)
            and last.index == p.index
        ):
            out[-1] = CallArguments(p.index, last.fragment + p.fragment)
        elif isinstance(p, TextPiece) and not p.text:
            continue
        else:
            out.append(p)
    return out


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class SpanScanner(ABC):
    """Splits content into plain text and `<tool_call>` spans; subclasses parse span bodies.

    Plain text is emitted as soon as it cannot be the start of a tag; trailing whitespace is held
    until more text shows whether a call follows it.
    """

    def __init__(self, tools: ToolSchemas) -> None:
        self.tools = tools
        self._buf = ""
        self._in_span = False
        self._strip_leading = False
        self._span_ws = ""
        self._calls = 0

    # -- subclass interface -------------------------------------------------------------
    @abstractmethod
    def _span_begin(self) -> None:
        """Reset per-span state after a start tag."""

    @abstractmethod
    def _span_feed(self, text: str, out: list[Piece]) -> int | None:
        """Consume `text` into the current span. Return how many chars of `text` the span used
        if it ended (the rest is content again), else None (all of it consumed)."""

    @abstractmethod
    def _span_finish(self, out: list[Piece]) -> None:
        """Generation ended inside a span: close or reject it."""

    def _new_call(self, name: str, out: list[Piece]) -> int:
        index = self._calls
        self._calls += 1
        out.append(CallHeader(index, name))
        return index

    # -- ToolCallStream -----------------------------------------------------------------
    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        self._buf += text
        self._pump(out)
        return out

    def close(self) -> list[Piece]:
        out: list[Piece] = []
        self._pump(out)
        if self._in_span:
            self._span_finish(out)
            self._in_span = False
            self._span_ended(out)
        else:
            self._emit_text(self._buf, out, before_call=False)
        self._buf = ""
        return out

    def _pump(self, out: list[Piece]) -> None:
        while self._buf:
            if self._in_span:
                text, self._buf = self._buf, ""
                used = self._span_feed(text, out)
                if used is None:
                    return
                self._in_span = False
                self._span_ended(out)
                self._buf = text[used:]
                continue
            i = self._buf.find(START_TAG)
            if i >= 0:
                content = self._buf[:i]
                body = content.rstrip()
                self._emit_text(body, out, before_call=True)
                # Kept aside: glue if the span is a call, text if it is rejected.
                self._span_ws = "" if self._strip_leading else content[len(body) :]
                self._buf = self._buf[i + len(START_TAG) :]
                self._in_span = True
                self._span_begin()
                continue
            keep = partial_suffix(self._buf, START_TAG)
            safe = self._buf[: len(self._buf) - keep]
            body = safe.rstrip()
            self._emit_text(body, out, before_call=False)
            self._buf = self._buf[len(body) :]
            return

    def _span_ended(self, out: list[Piece]) -> None:
        """A rejected span is text: it keeps the whitespace around it. A call drops it."""
        if out and isinstance(out[-1], SpanRejected):
            if self._span_ws:
                out.insert(len(out) - 1, TextPiece(self._span_ws))
            self._strip_leading = False
        else:
            self._strip_leading = True

    def _emit_text(self, text: str, out: list[Piece], *, before_call: bool) -> None:
        if self._strip_leading:
            text = text.lstrip()
            if text:
                self._strip_leading = False
        if before_call:
            text = text.rstrip()
        if text:
            out.append(TextPiece(text))


class FoldingParser(ABC):
    """Base for parsers whose complete entry is the fold of their streaming entry."""

    name: str

    @abstractmethod
    def stream(self, tools: ToolSchemas) -> ToolCallStream:
        """A fresh incremental parser for one generation."""

    def parse(self, text: str, tools: ToolSchemas) -> list[Piece]:
        s = self.stream(tools)
        return coalesce(s.feed(text) + s.close())
