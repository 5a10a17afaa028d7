"""Split generated text into reasoning (`<think>...</think>`) and content, incrementally.

Qwen3 models open their thoughts with `<think>` at the start of the answer, or the chat template
already ends the prompt with `<think>` (then the answer starts inside reasoning). `<think>` is only
recognised before any content, so code that mentions the tag later stays content. Whitespace right
inside and after the tags is template glue and is dropped.
"""

from __future__ import annotations

from typing import Literal

from toolflash.gateway.tool_parsers.base import partial_suffix

OPEN = "<think>"
CLOSE = "</think>"

Channel = Literal["reasoning", "content"]


class ReasoningSplitter:
    """Feed generated text; get (channel, text) segments in order."""

    def __init__(self, *, start_in_reasoning: bool) -> None:
        # "start": no content yet, `<think>` may still open; "reasoning"; "content": passthrough.
        self._state = "reasoning" if start_in_reasoning else "start"
        self._buf = ""
        self._strip = start_in_reasoning

    def feed(self, text: str) -> list[tuple[Channel, str]]:
        self._buf += text
        out: list[tuple[Channel, str]] = []
        while self._buf:
            if self._state == "start":
                head = self._buf.lstrip()
                if head.startswith(OPEN):
                    self._buf = head[len(OPEN) :]
                    self._state, self._strip = "reasoning", True
                    continue
                if OPEN.startswith(head):  # only whitespace or a prefix of the tag so far
                    break
                self._state = "content"
                continue
            if self._state == "content":
                self._emit("content", self._buf, out)
                self._buf = ""
                break
            i = self._buf.find(CLOSE)
            if i >= 0:
                self._emit("reasoning", self._buf[:i].rstrip(), out)
                self._buf = self._buf[i + len(CLOSE) :]
                self._state, self._strip = "content", True
                continue
            keep = partial_suffix(self._buf, CLOSE)
            safe = self._buf[: len(self._buf) - keep].rstrip()
            self._emit("reasoning", safe, out)
            self._buf = self._buf[len(safe) :]
            break
        return out

    def close(self) -> list[tuple[Channel, str]]:
        out: list[tuple[Channel, str]] = []
        if self._buf:
            channel: Channel = "reasoning" if self._state == "reasoning" else "content"
            self._emit(channel, self._buf, out)
            self._buf = ""
        return out

    def _emit(self, channel: Channel, text: str, out: list[tuple[Channel, str]]) -> None:
        if self._strip:
            text = text.lstrip()
            if text:
                self._strip = False
        if text:
            out.append((channel, text))
