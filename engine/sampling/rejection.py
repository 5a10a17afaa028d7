"""The speculative sampling rule (Leviathan et al. 2023; Chen et al. 2023), vectorised.

For drafted tokens d_1..d_K drawn from the drafter's q and the target's p at the same
positions: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) while every earlier one was
accepted; at the first rejection draw the replacement from the normalised residual
max(0, p_i - q_i); when all K are accepted draw the bonus token from p_{K+1}. The committed
tokens are then distributed exactly as K+1 (or fewer) AR draws from p.

The rule only needs q_i to be the distribution d_i was actually drawn from given everything
before it. DFlash drafts all block positions in one parallel pass, so q_i depends on the
verified prefix but not on d_1..d_{i-1}: that is a valid (if uninformed) conditional, the
proof goes through unchanged, and exactness holds. Deterministic proposals (greedy drafter
argmax, tokens forced by a constraint) are the special case of a one-hot q (`q=None`).
"""

from __future__ import annotations

import mlx.core as mx

from .shaping import sample


def one_hot(tokens: mx.array, vocab_size: int) -> mx.array:
    """Probabilities [..., K, V] putting all mass on `tokens` [..., K]."""
    return (tokens[..., None] == mx.arange(vocab_size)).astype(mx.float32)


def rejection_verify(
    draft: mx.array,
    q: mx.array | None,
    p: mx.array,
    accept_key: mx.array,
    resample_key: mx.array,
    allowed: int | None = None,
) -> tuple[mx.array, mx.array]:
    """Accepted count [...] (0..K) and the next token [...] after the accepted prefix.

    `draft` [..., K] tokens drawn from `q` [..., K, V] (probabilities; None: one-hot at the
    draft), `p` [..., K+1, V] the target's probabilities (row i scores the token after the
    first i drafted tokens). `allowed` caps acceptance where a constraint refused the drafted
    token: its processed p gives that token no mass, so the rule rejects it anyway and the
    residual is the exact replacement; the cap only guards the rows after it.
    Leading dimensions are independent trials (the tests draw thousands at once). Only
    gathers and one row per trial touch the vocabulary dimension."""
    k = draft.shape[-1]
    vocab = p.shape[-1]
    idx = draft[..., None].astype(mx.int32)
    p_tok = mx.take_along_axis(p[..., :k, :], idx, axis=-1)[..., 0]
    q_tok = mx.take_along_axis(q, idx, axis=-1)[..., 0] if q is not None else mx.ones_like(p_tok)
    u = mx.random.uniform(shape=p_tok.shape, key=accept_key)
    ok = (u * q_tok < p_tok).astype(mx.int32)  # u < p/q: probability min(1, p/q)
    accepted = mx.cumprod(ok, axis=-1).sum(axis=-1)
    if allowed is not None:
        accepted = mx.minimum(accepted, allowed)
    # The row after the accepted prefix: residual max(0, p - q) there, or the bonus row
    # (q counts as zero) when everything was accepted.
    p_row = mx.take_along_axis(p, accepted[..., None, None], axis=-2)[..., 0, :]
    row = mx.minimum(accepted, k - 1)[..., None]
    if q is not None:
        q_row = mx.take_along_axis(q, row[..., None], axis=-2)[..., 0, :]
    else:
        d_row = mx.take_along_axis(draft, row, axis=-1)
        q_row = (mx.arange(vocab) == d_row).astype(p.dtype)
    q_row = q_row * (accepted < k)[..., None]
    residual = mx.maximum(p_row - q_row, 0.0)
    # p == q leaves no residual, but then rejection has probability 0; guard float ties.
    residual = mx.where(residual.sum(axis=-1, keepdims=True) > 0, residual, p_row)
    return accepted, sample(residual, resample_key)
