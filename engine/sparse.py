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


class SparseLineageError(RuntimeError):
    """A sparse-prefill state was about to be reused as if it were dense."""


class SparseSelectionError(ValueError):
    """A sparse selection that is not a list of whole, ordered chunks ending at the prompt end."""


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
        first_gap = next(
            (hi for (_, hi), (lo2, _) in zip(self.ranges, self.ranges[1:]) if lo2 > hi),
            self.ranges[0][0] if self.ranges[0][0] > 0 else prompt_len,
        )
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
