"""Greedy acceptance: the longest drafted prefix that equals the target's own choices."""

from __future__ import annotations

import mlx.core as mx


def greedy_acceptance(draft: mx.array, target_choice: mx.array) -> mx.array:
    """draft [L-1] proposed tokens for positions 1..L-1; target_choice [L] the target's argmax
    after each block position. Returns the accepted length a (0..L-1) as a scalar array, so
    the cycle needs a single host sync."""
    matches = (draft == target_choice[:-1]).astype(mx.int32)
    return mx.cumprod(matches).sum()
