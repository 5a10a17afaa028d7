"""A published, reusable session state with its key and bookkeeping."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from toolflash.cache.state import SessionState

from .key import SnapshotKey


@dataclass(frozen=True)
class Snapshot:
    """A dense-lineage session state at a token prefix. Sparse-prefill states have another
    type (`toolflash.engine.sparse.SparseState`) and can never become a Snapshot."""

    key: SnapshotKey
    state: SessionState
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if type(self.state) is not SessionState:
            raise TypeError(
                f"only dense SessionState can be a snapshot, not {type(self.state).__name__}"
            )

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.state.tokens

    @property
    def nbytes(self) -> int:
        return self.state.nbytes

    def feature_spans(self) -> list[tuple[int, int]]:
        """Positions whose drafter features the snapshot holds (sink + window trimming)."""
        draft = self.state.draft
        if draft is None:
            return []
        if draft.window is None or draft.covered <= draft.sink + draft.window:
            return [(0, draft.covered)]
        return [(0, draft.sink), (draft.covered - draft.window, draft.covered)]


def is_prefix(prefix: tuple[int, ...], tokens: tuple[int, ...] | list[int]) -> bool:
    """`prefix` is an exact token prefix of `tokens` (and not longer)."""
    n = len(prefix)
    return 0 < n <= len(tokens) and tuple(tokens[:n]) == prefix
