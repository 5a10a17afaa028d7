"""Positional sparse prefill over a session: only the selected prompt chunks are computed, each
at its true positions (RoPE and drafter context at the original positions).

Up to the first dropped position the prefill is an ordinary dense one, so its states may be
published for reuse; from the first dropped chunk on the session is lineage "sparse" and
nothing it computes is ever published (`GenerationSession.export_state` refuses)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from toolflash.cache.state import SessionState

from .sparse import SparseSelection
from .targets.base import cache_offset

if TYPE_CHECKING:
    from .session import GenerationSession

__all__ = ["sparse_feed", "sparse_prefill"]


def sparse_prefill(
    session: GenerationSession,
    prompt: Sequence[int],
    selection: SparseSelection,
    restore: SessionState | None = None,
    publish_at: Sequence[int] = (),
    publish: Callable[[SessionState], None] | None = None,
) -> int:
    """Prefill the selected chunks of `prompt` and commit the first token (returned).
    `restore` may supply a dense prefix that ends at or before the first dropped position;
    states at `publish_at` positions before that position are handed to `publish` (dense
    lineage, reusable by any request)."""
    if not prompt:
        raise ValueError("empty prompt")
    start = len(restore.tokens) if restore is not None else 0
    selection.validate(len(prompt), start)  # refused before anything is loaded
    start = session.restore(prompt, restore)
    sparse_feed(session, prompt, selection, start, publish_at, publish)
    return session.commit_first(prompt)


def sparse_feed(
    session: GenerationSession,
    prompt: Sequence[int],
    selection: SparseSelection,
    start: int = 0,
    publish_at: Sequence[int] = (),
    publish: Callable[[SessionState], None] | None = None,
) -> None:
    """`sparse_prefill` without committing the first token, for callers that hold
    prompt[:start] in the session already (fresh, or a loaded dense prefix)."""
    ranges = selection.validate(len(prompt), start)
    gap = selection.first_gap(len(prompt))
    if gap > start:
        session.feed_prompt(prompt, start, gap, publish_at, publish)
    session.lineage = "sparse"
    chunk = session.prefill_chunk
    for lo, hi in ranges:
        for pos in range(max(lo, gap), hi, chunk):
            end = min(pos + chunk, hi)
            session.position_shift = pos - cache_offset(session.cache)
            session.feed_chunk(prompt[pos:end], pos)
    session.position_shift = len(prompt) - cache_offset(session.cache)
