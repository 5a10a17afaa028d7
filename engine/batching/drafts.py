"""One drafter forward for the rows of a batched verify that draft the same block size.

Each row's DFlash block ([staged, mask * (L-1)]) is denoised against its own drafter context at
its own positions: the contexts are left-padded to the longest and the padding masked out, and
each block is RoPE'd at its own offset. Row i's logits are what `dflash_proposal` gives for that
session alone, up to float rounding (a draft only proposes: the target's verify decides what is
committed, so rounding can move acceptance, never the output). Drafting rows one by one costs a
drafter forward each, serially; on a GPU one forward of B blocks costs about as much as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx

from ..session import dflash_proposal

if TYPE_CHECKING:
    from ..session import GenerationSession

__all__ = ["dflash_logits", "shares_drafter"]


def shares_drafter(sessions: Sequence[GenerationSession]) -> bool:
    """Whether `sessions` can draft in one forward: all with the same DFlash drafter through
    the default proposer, and no sliding-window drafter layers (their masks follow each
    context's positions; those rows draft one by one)."""
    first = sessions[0].drafter
    return (
        first is not None
        and not first.has_sliding_layers
        and all(
            s.drafter is first and s.draft_ctx is not None and s.proposer is dflash_proposal
            for s in sessions
        )
    )


def dflash_logits(sessions: Sequence[GenerationSession], block_size: int) -> mx.array:
    """The drafter's logits [B, block_size - 1, V] for every session (`shares_drafter`), row i
    scoring session i's block positions 1..L-1."""
    first = sessions[0]
    drafter = first.drafter
    assert drafter is not None
    contexts = []
    for s in sessions:
        assert s.draft_ctx is not None
        contexts.append(s.draft_ctx.absorb())
    lengths = [int(kv[0][0].shape[2]) if kv else 0 for kv in contexts]
    longest = max(lengths)
    ctx_kv = None
    if longest:
        ctx_kv = [
            (
                _left_pad([kv[layer][0] if kv else None for kv in contexts], longest),
                _left_pad([kv[layer][1] if kv else None for kv in contexts], longest),
            )
            for layer in range(len(drafter.layers))
        ]
    mask = None
    if min(lengths) < longest:
        # Row i attends to its own context (the last lengths[i] of the padded columns) and
        # to its whole block.
        columns = mx.arange(longest + block_size)[None, :]
        starts = mx.array([longest - n for n in lengths])[:, None]
        mask = (columns >= starts)[:, None, None, :]  # [B, 1, 1, longest + L]
    block = mx.array([[s.staged] + [s.mask_id] * (block_size - 1) for s in sessions])
    offsets = mx.array([s.fed for s in sessions])
    hidden = drafter.denoise(first.target.embed(block), offsets, ctx_kv, mask)
    return first.target.lm_head(hidden[:, 1:])


def _left_pad(rows: Sequence[mx.array | None], length: int) -> mx.array:
    """Per-row context keys or values [1, H, n_i, D] (None: no context yet) as one
    [B, H, length, D], each row's n_i at the end."""
    like = next(r for r in rows if r is not None)
    _, heads, _, dim = like.shape
    parts = []
    for r in rows:
        have = 0 if r is None else int(r.shape[2])
        pad = mx.zeros((1, heads, length - have, dim), dtype=like.dtype)
        parts.append(pad if r is None else (r if have == length else mx.concatenate([pad, r], 2)))
    return mx.concatenate(parts, axis=0)
