"""Scaled dot-product attention for MLX's CPU backend, with a fast softmax.

On the CPU, `mx.exp` costs about 10-12 ns per element (scalar libm), against ~0.2 ns for a
multiply, so attention's softmax dominates long-context prefill and the speculative verify
(16 queries x the whole context x every head and layer). Here softmax inputs (already shifted
so the row maximum is 0) go through `exp_nonpositive`: a degree-10 Taylor polynomial of
exp(x / 64) raised to the 64th power by six squarings, compiled into one elementwise kernel;
about 5x faster than `mx.exp` on cache-resident blocks, relative error below 1e-5.

`reference_attention` is the same computation with `mx.exp`; `attention` matches
`mx.fast.scaled_dot_product_attention` (what mlx-lm calls) to float32 rounding, and the
parity tests pin both. GPUs keep MLX's fused kernel (see `attention_for_device`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import mlx.core as mx

_SQUARINGS = 6  # exp(x) = exp(x / 64) ** 64
_DEGREE = 10  # Taylor terms of exp on [-87/64, 0]: truncation error < 2e-8 relative
_COEFFS = [1.0 / math.factorial(k) for k in range(_DEGREE + 1)]
_FLOOR = -87.0  # exp(-87) ~ 1.6e-38, the float32 normal range; masked scores end here

Attention = Callable[..., mx.array]


@mx.compile
def exp_nonpositive(x: mx.array) -> mx.array:
    """exp(x) for x <= 0 (softmax inputs after subtracting the row maximum); -inf and
    anything below -87 give ~1e-38, which a softmax row sum never notices."""
    y = mx.maximum(x, _FLOOR) * (1.0 / 2**_SQUARINGS)
    p = mx.full(y.shape, _COEFFS[_DEGREE], dtype=y.dtype)
    for c in reversed(_COEFFS[:_DEGREE]):
        p = p * y + c
    for _ in range(_SQUARINGS):
        p = p * p
    return p


def _softmax(scores: mx.array, exp: Callable[[mx.array], mx.array]) -> mx.array:
    shifted = scores - mx.max(scores, axis=-1, keepdims=True)
    e = exp(shifted)
    return e / mx.sum(e, axis=-1, keepdims=True)


def _scores_mask(mask: Any, n_queries: int, n_keys: int) -> mx.array | None:
    """mlx-lm's mask argument as a boolean or additive array broadcastable to the scores:
    "causal" aligns the queries with the last keys (the cache holds earlier positions)."""
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        q_pos = (n_keys - n_queries) + mx.arange(n_queries)
        return mx.arange(n_keys)[None, :] <= q_pos[:, None]
    return mask


def _attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    mask: Any,
    exp: Callable[[mx.array], mx.array],
) -> mx.array:
    b, n_heads, n_q, dim = q.shape
    n_kv = int(k.shape[1])
    rep = n_heads // n_kv
    n_k = int(k.shape[2])
    # Grouped-query attention without repeating K/V: the query heads that share a KV head
    # become extra query rows of it ([B, H_kv, rep * L, D]).
    qg = (q * scale).reshape(b, n_kv, rep * n_q, dim)
    scores = (qg @ k.swapaxes(-1, -2)).reshape(b, n_kv, rep, n_q, n_k)
    m = _scores_mask(mask, n_q, n_k)
    if m is not None:
        if m.ndim == 4:  # [B, H, L, S] as mlx-lm builds it: split H like the queries
            m = m.reshape(m.shape[0], -1, rep if m.shape[1] == n_heads else 1, n_q, n_k)
        if m.dtype == mx.bool_:
            scores = mx.where(m, scores, mx.array(-mx.inf, dtype=scores.dtype))
        else:
            scores = scores + m
    probs = _softmax(scores.reshape(b, n_kv, rep * n_q, n_k), exp).astype(v.dtype)
    return (probs @ v).reshape(b, n_heads, n_q, -1)


# Score elements per query block (1 MB of float32): a block's scores stay in L2 through the softmax
# (measured best of 2^16..2^21 on this 2-core x86 CPU; larger blocks are memory-bound).
_BLOCK_ELEMENTS = 1 << 18
_MIN_BLOCK_ROWS = 16
# Below this many scores per head the fused kernel is as fast (measured on a 2-core x86 CPU).
_SMALL = 256


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any = None) -> mx.array:
    """Softmax(q k^T * scale + mask) v with the fast exponential. q [B, H, L, D];
    k, v [B, H_kv, S, D] (H a multiple of H_kv); mask None, "causal" or an array.
    Long query runs (prefill chunks) go in blocks of rows so each block's scores fit in
    cache; rows are independent, so blocking does not change the result."""
    b, n_heads, n_q, _ = q.shape
    n_k = int(k.shape[2])
    if n_q * n_k < _SMALL:  # one query over a short context: the fused call's lower overhead wins
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    # Never split a verify block: its few rows are faster in one piece than in cache-sized ones.
    rows = max(_MIN_BLOCK_ROWS, _BLOCK_ELEMENTS // max(1, b * n_heads * n_k))
    if n_q <= rows:
        return _attention(q, k, v, scale, mask, exp_nonpositive)
    full = _scores_mask(mask, n_q, n_k)
    outs = []
    for start in range(0, n_q, rows):
        stop = min(start + rows, n_q)
        part = None if full is None else full[..., start:stop, :]
        outs.append(_attention(q[:, :, start:stop], k, v, scale, part, exp_nonpositive))
    return mx.concatenate(outs, axis=2)


def reference_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any = None
) -> mx.array:
    """`attention` with `mx.exp`: the pure-MLX reference the fast path is tested against."""
    return _attention(q, k, v, scale, mask, mx.exp)


def fast_attention_enabled() -> bool:
    """Whether targets use `attention` instead of MLX's fused kernel: on the CPU backend,
    unless TOOLFLASH_FAST_ATTENTION=0."""
    if os.environ.get("TOOLFLASH_FAST_ATTENTION", "1") == "0":
        return False
    return bool(mx.default_device() == mx.cpu)
