"""Positional sparse prefill: which prompt tokens to keep, and the lineage rule.

A sparse session computes only selected prompt chunks, at their true positions. Its caches are
a different lineage: never published as reusable snapshots and never restored into a dense
request (only a dense prefix before the first dropped position may seed it). Selections must
be whole chunks: scattered single tokens give the drafter a context it was never trained on
and collapse acceptance, so they are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Lineage = Literal["dense", "sparse"]
# How the chunks beyond the structural rules are ranked (`toolflash.engine.sparse_scoring`):
# "recent" keeps the prompt's head and its latest chunks only; "structural" adds the rules
# (tool definitions, the last turn) and fills by recency; "similarity" adds the rules and fills
# by how close a chunk's mean input embedding is to the last turn's.
ScorerName = Literal["recent", "structural", "similarity"]
SCORERS: tuple[ScorerName, ...] = ("recent", "structural", "similarity")
# Below this many prompt tokens left to compute (after the prefix cache) a prefill stays dense.
SPARSE_MIN_TOKENS = 4096


class SparseLineageError(RuntimeError):
    """A sparse-prefill state was about to be reused as if it were dense."""


class SparseSelectionError(ValueError):
    """A sparse selection that is not a list of whole, ordered chunks ending at the prompt end."""


@dataclass(frozen=True)
class SparsePrefill:
    """A request's opt-in sparse prefill: compute about `keep` of the prompt's tokens (chunks
    of `chunk` tokens chosen by `scorer`), only when at least `min_tokens` prompt tokens are
    left to compute after the prefix cache; shorter prompts prefill dense."""

    keep: float
    min_tokens: int = SPARSE_MIN_TOKENS
    chunk: int = 64
    scorer: ScorerName = "structural"

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"sparse prefill keep must be in (0, 1], got {self.keep}")
        if self.chunk < 1 or self.min_tokens < 0:
            raise ValueError("sparse prefill chunk must be >= 1 and min_tokens >= 0")
        if self.scorer not in SCORERS:
            raise ValueError(f"sparse prefill scorer must be one of {', '.join(SCORERS)}")


@dataclass(frozen=True)
class SparseSelection:
    """Kept prompt ranges [start, end); boundaries on multiples of `chunk` (except the
    prompt end). The last range must end at the prompt end: the first output token is
    chosen at the last prompt position."""

    ranges: tuple[tuple[int, int], ...]
    chunk: int = 32

    def validate(self, prompt_len: int, dense_prefix: int = 0) -> list[tuple[int, int]]:
        """The ranges still to compute after a dense prefix of `dense_prefix` tokens."""
        if self.chunk < 1:
            raise SparseSelectionError("chunk must be >= 1")
        if not self.ranges:
            raise SparseSelectionError("empty selection")
        prev_end = 0
        for lo, hi in self.ranges:
            if not 0 <= lo < hi <= prompt_len or lo < prev_end:
                raise SparseSelectionError(
                    f"range [{lo}, {hi}) is out of order or outside the prompt (0..{prompt_len})"
                )
            for edge in (lo, hi):
                if edge % self.chunk and edge != prompt_len:
                    raise SparseSelectionError(
                        f"range [{lo}, {hi}) is not chunk-contiguous: boundaries must be "
                        f"multiples of {self.chunk} (scattered tokens collapse drafter "
                        "acceptance)"
                    )
            prev_end = hi
        if self.ranges[-1][1] != prompt_len:
            raise SparseSelectionError("the last range must end at the end of the prompt")
        first_gap = self.first_gap(prompt_len)
        if dense_prefix > first_gap:
            raise SparseSelectionError(
                f"a dense prefix of {dense_prefix} tokens reaches past the first dropped "
                f"position {first_gap}"
            )
        out = []
        for lo, hi in self.ranges:
            lo = max(lo, dense_prefix)
            if lo < hi:
                out.append((lo, hi))
        return out

    def first_gap(self, prompt_len: int) -> int:
        """The first dropped position (`prompt_len` when nothing is dropped): everything
        before it is computed exactly as a dense prefill would."""
        if self.ranges[0][0] > 0:
            return 0
        return next(
            (hi for (_, hi), (lo2, _) in zip(self.ranges, self.ranges[1:]) if lo2 > hi),
            prompt_len,
        )

    @property
    def kept(self) -> int:
        """Prompt tokens the selection keeps."""
        return sum(hi - lo for lo, hi in self.ranges)
