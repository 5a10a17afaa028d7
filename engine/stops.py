"""Where a generation must end: EOS ids, stop strings and the token limit, decided per token."""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Tokens of already-emitted output re-decoded to find stop strings spanning a cycle boundary.
_TAIL_TOKENS = 32


class StopMatcher:
    """Decides, for tokens about to be committed, the index of the last one to emit."""

    def __init__(
        self,
        eos_ids: frozenset[int],
        stop_strings: Sequence[str],
        max_tokens: int,
        decode: Callable[[Sequence[int]], str],
    ):
        self.eos_ids = eos_ids
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.max_tokens = max_tokens
        self.decode = decode
        self.emitted: list[int] = []
        self.reason: str | None = None  # "stop" or "length" once matched

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.emitted)

    def check(self, candidates: Sequence[int]) -> int | None:
        """Index of the last candidate to emit if generation ends inside `candidates`,
        else None. Records the candidates it lets through as emitted."""
        end: int | None = None
        for j, tok in enumerate(candidates):
            if tok in self.eos_ids:
                end, self.reason = j, "stop"
                break
        if self.stop_strings:
            limit = len(candidates) if end is None else end + 1
            hit = self._stop_string_end(candidates[:limit])
            if hit is not None:
                end, self.reason = hit, "stop"
        if end is None and len(candidates) >= self.remaining:
            end, self.reason = self.remaining - 1, "length"
        self.emitted.extend(candidates if end is None else candidates[: end + 1])
        return end

    def _stop_string_end(self, candidates: Sequence[int]) -> int | None:
        tail = self.emitted[-_TAIL_TOKENS:]
        before = self.decode(tail)
        if not self._has_new_stop(before, self.decode([*tail, *candidates])):
            return None
        for j in range(len(candidates)):
            if self._has_new_stop(before, self.decode([*tail, *candidates[: j + 1]])):
                return j
        return None

    def _has_new_stop(self, before: str, after: str) -> bool:
        longest = max(len(s) for s in self.stop_strings)
        window = after[max(0, len(before) - longest + 1) :]
        return any(s in window for s in self.stop_strings)


def visible_text(text: str, sent: int, stop_strings: Sequence[str]) -> tuple[str, bool]:
    """The next delta of `text` beyond `sent` characters that is safe to show, and whether a
    stop string was found (the delta then ends right before it). Holds back a suffix that
    could still become a stop string, and a trailing incomplete UTF-8 character."""
    stops = [s for s in stop_strings if s]
    if stops:
        longest = max(len(s) for s in stops)
        start = max(0, sent - longest + 1)
        hits = [i for s in stops if (i := text.find(s, start)) >= 0]
        if hits:
            return text[sent : max(sent, min(hits))], True
    end = len(text)
    while end > sent and text[end - 1] == "\ufffd":
        end -= 1
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, end - sent), 0, -1):
            if text[end - k : end] == s[:k]:
                hold = max(hold, k)
                break
    return text[sent : end - hold], False
