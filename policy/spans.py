"""Online span-kind detection: what the output is doing right now, from the committed text.

Span kinds: `text`, `reasoning` (inside `<think>`...`</think>`), `tool_call` (between
`<tool_call>` and `</tool_call>`, whatever the body: hermes JSON or Qwen3-Coder XML) and `json`
(the whole answer when the request asked for a JSON response format, else a top-level JSON body:
an answer whose first non-blank character opens an object or array, until it closes).

The tracker is fed the text deltas a generation commits, in order; markers may be split across
deltas (a spec cycle commits several tokens, an AR step one), so a possible marker prefix at the
end of a delta is held back until the next one decides it. Like the gateway's reasoning splitter,
`<think>` only opens reasoning before any answer text, so code that mentions the tag stays text.
"""

from __future__ import annotations

from typing import Literal

SpanKind = Literal["text", "reasoning", "tool_call", "json"]
SPAN_KINDS: tuple[SpanKind, ...] = ("text", "reasoning", "tool_call", "json")

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

# What ends the current state, and where it leads. `text` is handled separately.
_CLOSERS: dict[str, str] = {"reasoning": THINK_CLOSE, "tool_call": CALL_CLOSE}


def partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    if "<" not in text[-16:]:  # every marker starts with "<": the common case is one find
        return 0
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


class SpanTracker:
    """Feed committed text deltas with `push`; `kind` is the span kind at the end of the text.

    `json_output` marks the whole answer as a JSON body (response_format json_object or
    json_schema); `start_in_reasoning` is for templates that end the prompt inside `<think>`.
    """

    def __init__(self, *, json_output: bool = False, start_in_reasoning: bool = False) -> None:
        self.json_output = json_output
        # Internal states: "start" (no answer text yet), "text", "reasoning", "tool_call", "json".
        self._state = "reasoning" if start_in_reasoning else "start"
        self._pending = ""  # held-back text that may be the start of a marker
        self._depth = 0  # JSON nesting depth while in a top-level JSON body
        self._in_string = False
        self._escape = False
        self.transitions = 0

    @property
    def kind(self) -> SpanKind:
        state = self._state
        if state in ("start", "text"):
            return "json" if self.json_output else "text"
        return state  # type: ignore[return-value]

    def push(self, text: str) -> SpanKind:
        """Consume the next committed text; return the span kind after it."""
        if not text:
            return self.kind
        s = self._pending + text
        self._pending = ""
        i = 0
        while i < len(s):
            state = self._state
            if state == "start":
                i = self._scan_start(s, i)
            elif state == "text":
                i = self._scan_text(s, i)
            elif state == "json":
                i = self._scan_json(s, i)
            else:
                i = self._scan_until(s, i, _CLOSERS[state])
        return self.kind

    # -- states -----------------------------------------------------------------------------
    def _enter(self, state: str) -> None:
        if state != self._state:
            self.transitions += 1
        self._state = state

    def _scan_start(self, s: str, i: int) -> int:
        """Before any answer text: blanks, `<think>`, a tool call, or the answer's first char."""
        while i < len(s) and s[i].isspace():
            i += 1
        if i == len(s):
            return i
        rest = s[i:]
        for marker, state in ((THINK_OPEN, "reasoning"), (CALL_OPEN, "tool_call")):
            if rest.startswith(marker):
                self._enter(state)
                return i + len(marker)
        # A marker may still be forming; decide when more text arrives.
        if THINK_OPEN.startswith(rest) or CALL_OPEN.startswith(rest):
            self._pending = rest
            return len(s)
        if rest.startswith(THINK_CLOSE):
            # The prompt left us inside reasoning without saying so: the thought ends here.
            self._enter("start")
            return i + len(THINK_CLOSE)
        if THINK_CLOSE.startswith(rest):
            self._pending = rest
            return len(s)
        if s[i] in "{[" and not self.json_output:
            self._enter("json")
            self._depth, self._in_string, self._escape = 0, False, False
            return i  # the JSON scanner counts the opening bracket
        self._enter("text")
        return i

    def _scan_text(self, s: str, i: int) -> int:
        j = s.find(CALL_OPEN, i)
        if j >= 0:
            self._enter("tool_call")
            return j + len(CALL_OPEN)
        keep = partial_suffix(s[i:], (CALL_OPEN,))
        if keep:
            self._pending = s[len(s) - keep :]
        return len(s)

    def _scan_until(self, s: str, i: int, closer: str) -> int:
        j = s.find(closer, i)
        if j >= 0:
            # After a thought the answer starts afresh; after a call, another call, text or a
            # JSON body may follow.
            self._enter("start")
            return j + len(closer)
        keep = partial_suffix(s[i:], (closer,))
        if keep:
            self._pending = s[len(s) - keep :]
        return len(s)

    def _scan_json(self, s: str, i: int) -> int:
        """Bracket depth, string-aware; the body ends where depth returns to zero."""
        depth, in_string, escape = self._depth, self._in_string, self._escape
        n = len(s)
        while i < n:
            c = s[i]
            i += 1
            if in_string:
                if escape:
                    escape = False
                elif c == "\\":
                    escape = True
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth <= 0:
                    self._depth, self._in_string, self._escape = 0, False, False
                    self._enter("text")
                    return i
        self._depth, self._in_string, self._escape = depth, in_string, escape
        return i
