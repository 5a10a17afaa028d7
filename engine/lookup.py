"""Drafter-free proposals: the tokens that followed the latest earlier occurrence of the output's
current suffix in the prompt + output (prompt lookup, n-gram drafting).

Agent outputs copy their context: paths and identifiers in tool arguments, code being edited,
lines quoted from a tool result, JSON keys. Where the last `n` committed tokens occurred before,
what followed them then is a cheap guess of what follows now; the target verifies it like a
drafter's block, so the output is unchanged (greedy or sampled: a deterministic proposal is
verified as a one-hot draft).

`NgramIndex` maps every n-gram (`min_n`..`max_n` tokens) of the indexed tokens to where its
latest occurrence was continued. It indexes incrementally (`sync` adds only tokens it has not
seen: O(max_n - min_n + 1) dictionary writes per token), so a prompt restored from the prefix
cache costs one pass over its tokens the first time a request drafts by lookup, and nothing
when it never does. The longest matching n-gram wins (a longer match predicts its continuation
better), and among occurrences of one n-gram the latest (the context nearest the cursor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LookupConfig:
    """How lookup drafts: the shortest and longest suffix it matches (tokens), and its block
    (drafted tokens + 1) where neither the request, the policy nor a drafter sets one
    (benchmarks/results/lookup_defaults.md measures the defaults against their neighbours).
    `spec_takeover`: a spec cycle whose lookup continuation fills its whole block verifies that
    instead of running the drafter, unless the drafter is on a run (`takes_over`)."""

    min_n: int = 3
    max_n: int = 4
    block_size: int = 8
    spec_takeover: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"lookup needs 1 <= min_n <= max_n, got {self.min_n}, {self.max_n}")
        if self.block_size < 2:
            raise ValueError(f"a lookup block drafts at least one token, got {self.block_size}")


def takes_over(copied: int, limit: int, drafter_last: tuple[int, int] | None) -> bool:
    """Whether a spec cycle verifies the lookup continuation (`copied` tokens long; the block
    drafts `limit`) instead of running the drafter: only a continuation that fills the block,
    and not while the drafter is on a run (`drafter_last`: accepted and drafted tokens of its
    last verified draft; at least half accepted is a run): in JSON a short match (a key seen
    before, followed by another value) copied in the middle of a drafter's run accepts nothing
    and costs the run. The first cycle, with no draft seen, copies."""
    if copied < limit:
        return False
    if drafter_last is None:
        return True
    accepted, drafted = drafter_last
    return 2 * accepted < drafted


class NgramIndex:
    """Where each n-gram of a growing token sequence was last continued."""

    def __init__(self, config: LookupConfig = LookupConfig()):
        self.config = config
        # n-gram (a tuple; lengths never collide) -> index of the token that followed its
        # latest occurrence. Only occurrences with a continuation are indexed, so the
        # sequence's own current suffix never matches itself.
        self._next: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are indexed

    def sync(self, tokens: Sequence[int]) -> None:
        """Index the n-grams of `tokens` that now have a continuation. `tokens` is the indexed
        sequence grown (a session's tokens only grow); a shorter one starts the index afresh."""
        end = len(tokens) - 1  # n-grams ending at positions < end have a continuation
        if end < self._indexed:
            self._next.clear()
            self._indexed = 0
        lo, hi = self.config.min_n, self.config.max_n
        table = self._next
        for j in range(self._indexed, end):
            for n in range(lo, min(hi, j + 1) + 1):
                table[tuple(tokens[j - n + 1 : j + 1])] = j + 1
        self._indexed = max(self._indexed, end)

    def propose(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the longest earlier match of the suffix of
        `tokens` ([] when no suffix of at least `min_n` tokens occurred before)."""
        if limit <= 0:
            return []
        self.sync(tokens)
        size = len(tokens)
        for n in range(min(self.config.max_n, size), self.config.min_n - 1, -1):
            start = self._next.get(tuple(tokens[size - n :]))
            if start is not None:
                return list(tokens[start : start + limit])
        return []
