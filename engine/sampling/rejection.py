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
argmax, tokens forced by a constraint) are the special case of a one-hot q.
"""

from __future__ import annotations

import mlx.core as mx


def one_hot(tokens: mx.array, vocab_size: int) -> mx.array:
    """Probabilities [..., K, V] putting all mass on `tokens` [..., K]."""
    return (tokens[..., None] == mx.arange(vocab_size)).astype(mx.float32)


def rejection_verify(
    draft: mx.array,
    q: mx.array,
    p: mx.array,
    accept_key: mx.array,
    resample_key: mx.array,
    allowed: int | None = None,
) -> tuple[mx.array, mx.array]:
    """Accepted count [...] (0..K) and the next token [...] after the accepted prefix.

    `draft` [..., K] tokens drawn from `q` [..., K, V] (probabilities), `p` [..., K+1, V] the
    target's probabilities (row i scores the token after the first i drafted tokens).
    `allowed` caps acceptance (a constraint refused the drafted token there, so the target's
    processed p gives it no mass and the residual is p itself). Leading dimensions are
    independent trials (the tests draw thousands at once)."""
    k = draft.shape[-1]
    idx = draft[..., None].astype(mx.int32)
    p_tok = mx.take_along_axis(p[..., :k, :], idx, axis=-1)[..., 0]
    q_tok = mx.take_along_axis(q, idx, axis=-1)[..., 0]
    u = mx.random.uniform(shape=p_tok.shape, key=accept_key)
    ok = (u * q_tok < p_tok).astype(mx.int32)  # u < p/q: probability min(1, p/q)
    accepted = mx.cumprod(ok, axis=-1).sum(axis=-1)
    if allowed is not None:
        accepted = mx.minimum(accepted, allowed)
    # q padded with a zero row: at accepted == K the "residual" max(0, p - 0) is the bonus p.
    q_ext = mx.concatenate([q, mx.zeros_like(q[..., :1, :])], axis=-2)
    at = accepted[..., None, None]
    p_row = mx.take_along_axis(p, at, axis=-2)[..., 0, :]
    q_row = mx.take_along_axis(q_ext, at, axis=-2)[..., 0, :]
    residual = mx.maximum(p_row - q_row, 0.0)
    # p == q leaves no residual, but then rejection has probability 0; guard float ties.
    residual = mx.where(residual.sum(axis=-1, keepdims=True) > 0, residual, p_row)
    token = mx.random.categorical(mx.log(residual), key=resample_key)
    return accepted, token
