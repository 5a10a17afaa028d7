"""Scaled dot-product attention for MLX's CPU backend, with a fast softmax.

On the CPU, `mx.exp` costs about 10-12 ns per element (scalar libm), against ~0.2 ns for a
multiply, so attention's softmax dominates long-context prefill and the speculative verify
(16 queries x the whole context x every head and layer). Here softmax inputs (already shifted
so the row maximum is 0) go through `exp_nonpositive`: a degree-10 Taylor polynomial of
exp(x / 64) raised to the 64th power by six squarings, compiled into elementwise kernels (MLX
fuses chains up to 11 ops deep, so the 28 ops run as three kernels over cache-resident data);
about 4-5x faster than `mx.exp` on cache-resident blocks, relative error below 2e-5.
`attention` uses `exp_shifted` instead: the row maximum subtracted in the same kernel and a
degree-6 Chebyshev fit with seven squarings (two kernels, about 2x faster again).

`attention` works on blocks of query rows (scores that stay in cache) and never touches more
of the [rows x keys] score matrix than it must: for mlx-lm's "causal" mask (the queries are the
last keys), a block sees every key before its first query unmasked and only its own R x R
diagonal needs a mask, so no mask array is built and the keys after the block are skipped;
`exp_shifted` subtracts the row maximum inside the exponential's kernel; the [rows x D] output is
divided by the row sums instead of the probabilities, and long chunks get those sums from the
P @ V matmul through a column of ones appended to V. `baseline_attention` is the previous
blocked kernel (full mask, softmax, then P @ V), kept for the benchmark's side-by-side.

`reference_attention` is the plain computation with `mx.exp`; `attention` matches
`mx.fast.scaled_dot_product_attention` (what mlx-lm calls) to float32 rounding, and the
parity tests pin both. GPUs keep MLX's fused kernel (see `fast_attention_enabled`).
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


def _exp_poly(x: mx.array) -> mx.array:
    y = mx.maximum(x, _FLOOR) * (1.0 / 2**_SQUARINGS)
    p = y * _COEFFS[_DEGREE] + _COEFFS[_DEGREE - 1]
    for c in reversed(_COEFFS[: _DEGREE - 1]):
        p = p * y + c
    for _ in range(_SQUARINGS):
        p = p * p
    return p


# exp_shifted's polynomial: the degree-6 Chebyshev interpolant of exp on [-87/128, 0]
# (numpy.polynomial.Chebyshev.interpolate(np.exp, 6, domain=[-87 / 128, 0]) in the power basis),
# raised to the 128th power by seven squarings. Its chain (subtract, floor, scale, 6 multiply-adds,
# 7 squarings: 22 ops) fits two of MLX's fused kernels (at most 11 ops deep) where the Taylor
# form above needs three; about 2x faster per element, relative error below 1.5e-5.
_SHIFTED_SQUARINGS = 7
_SHIFTED_COEFFS = [
    0.999999998790183,
    0.999999825407589,
    0.4999958711842669,
    0.16662988528675785,
    0.041509549583910656,
    0.007984310232786786,
    0.0009922985857376025,
]


@mx.compile
def exp_nonpositive(x: mx.array) -> mx.array:
    """exp(x) for x <= 0 (softmax inputs after subtracting the row maximum); -inf and
    anything below -87 give ~1e-38, which a softmax row sum never notices. (The previous
    kernel's exponential; `attention` uses `exp_shifted`.)"""
    return _exp_poly(x)


@mx.compile
def exp_shifted(s: mx.array, m: mx.array) -> mx.array:
    """exp(s - m) for m >= s (the row maximum, broadcast), -inf and anything below -87 giving
    ~1e-38: the subtraction rides in the exponential's kernel (one pass over the scores less),
    and the polynomial is the shorter one above."""
    y = mx.maximum(s - m, _FLOOR) * (1.0 / 2**_SHIFTED_SQUARINGS)
    c = _SHIFTED_COEFFS
    p = y * c[-1] + c[-2]
    for coeff in reversed(c[:-2]):
        p = p * y + coeff
    for _ in range(_SHIFTED_SQUARINGS):
        p = p * p
    return p


def _softmax(scores: mx.array, exp: Callable[[mx.array], mx.array] | None) -> mx.array:
    """The row softmax with `exp`; None: MLX's own, computed in float32 (`precise`)."""
    if exp is None:
        return mx.softmax(scores, axis=-1, precise=True)
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


def _grouped_mask(m: mx.array, n_heads: int, rep: int, n_q: int, n_k: int) -> mx.array:
    """A [B, H, L, S] mask (as mlx-lm builds it) split like the grouped queries; a size-1
    query or key axis (a padding mask shared by every query) stays broadcast."""
    if m.ndim == 4:
        rows, keys = m.shape[2], m.shape[3]
        return m.reshape(m.shape[0], -1, rep if m.shape[1] == n_heads else 1, rows, keys)
    return m


def _masked(scores: mx.array, m: mx.array) -> mx.array:
    """Scores with a boolean (True = attend) or additive mask applied. Boolean-masked scores
    become the dtype's lowest finite value, not -inf, so a row with no visible key softmaxes
    to uniform weights (what MLX's fused kernel returns) instead of 0/0."""
    if m.dtype == mx.bool_:
        return mx.where(m, scores, mx.array(mx.finfo(scores.dtype).min, dtype=scores.dtype))
    return scores + m


def _attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    mask: Any,
    exp: Callable[[mx.array], mx.array] | None,
) -> mx.array:
    """The plain computation (full mask, softmax, then P @ V): the reference, the previous
    fast path that the benchmark compares against, and `composed_attention` (exp None)."""
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
        scores = _masked(scores, _grouped_mask(m, n_heads, rep, n_q, n_k))
    probs = _softmax(scores.reshape(b, n_kv, rep * n_q, n_k), exp).astype(v.dtype)
    return (probs @ v).reshape(b, n_heads, n_q, -1)


def _grouped_rows(q: mx.array, n_kv: int, scale: float) -> mx.array:
    """q [B, H, L, D] scaled, as [B, H_kv, rep * L, D]: the query heads that share a KV head
    become extra query rows of it (grouped-query attention without repeating K/V)."""
    b, n_heads, n_q, dim = q.shape
    return (q * scale).reshape(b, n_kv, (n_heads // n_kv) * n_q, dim)


def _fused_block(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """One block of rows with any mask (None or an array aligned with these rows): the
    exponential takes the row maximum in its kernel, and the [rows x D] output is divided by
    the row sums instead of the [rows x keys] probabilities."""
    b, n_heads, n_q, _ = q.shape
    n_kv = int(k.shape[1])
    rep = n_heads // n_kv
    n_k = int(k.shape[2])
    scores = _grouped_rows(q, n_kv, scale) @ k.swapaxes(-1, -2)
    if mask is not None:
        m = _grouped_mask(mask, n_heads, rep, n_q, n_k)
        scores = _masked(scores.reshape(b, n_kv, rep, n_q, n_k), m).reshape(b, n_kv, -1, n_k)
    e = exp_shifted(scores, mx.max(scores, axis=-1, keepdims=True))
    out = (e.astype(v.dtype) @ v) / mx.sum(e, axis=-1, keepdims=True).astype(v.dtype)
    return out.reshape(b, n_heads, n_q, -1)


def _causal_block(
    qg: mx.array, k: mx.array, v: mx.array, visible: int, tri: mx.array, rep: int, dim: int
) -> mx.array:
    """Grouped query rows qg [B, H_kv, rep * R, D] at positions visible .. visible + R - 1,
    against keys 0 .. visible + R - 1: the first `visible` keys are seen by every row (no
    mask), the last R form the causal diagonal (masked with `tri`, R x R). Both parts share
    one row maximum, so the result is one softmax, summed in two pieces. `v` may carry a
    column of ones after its `dim` values (then P @ V yields the row sums too)."""
    b, n_kv, n_rows, _ = qg.shape
    r = n_rows // rep
    diag = slice(visible, visible + r)
    s2 = qg @ k[:, :, diag].swapaxes(-1, -2)
    s2 = _masked(s2.reshape(b, n_kv, rep, r, r), tri).reshape(b, n_kv, n_rows, r)
    row_max = mx.max(s2, axis=-1, keepdims=True)
    if visible:
        s1 = qg @ k[:, :, :visible].swapaxes(-1, -2)
        row_max = mx.maximum(row_max, mx.max(s1, axis=-1, keepdims=True))
        e1, e2 = exp_shifted(s1, row_max), exp_shifted(s2, row_max)
        out = e1 @ v[:, :, :visible] + e2 @ v[:, :, diag]
        if v.shape[-1] > dim:
            return out[..., :dim] / out[..., dim:]
        return out / (mx.sum(e1, axis=-1, keepdims=True) + mx.sum(e2, axis=-1, keepdims=True))
    e2 = exp_shifted(s2, row_max)
    out = e2 @ v[:, :, diag]
    if v.shape[-1] > dim:
        return out[..., :dim] / out[..., dim:]
    return out / mx.sum(e2, axis=-1, keepdims=True)


# Score elements per query block (1 MB of float32): a block's scores stay in L2 through the softmax
# (measured best of 2^16..2^21 on this 2-core x86 CPU; larger blocks are memory-bound).
_BLOCK_ELEMENTS = 1 << 18
_MIN_BLOCK_ROWS = 16
# Below this many scores per head the fused kernel is as fast (measured on a 2-core x86 CPU).
_SMALL = 256
# From this many queries on, the row sums come from P @ [V | 1] (one extra output column of the
# matmul that reads P anyway) instead of a separate pass over P; fewer queries do not repay the
# copy of V that appending the column costs.
_ONES_COLUMN_QUERIES = 64


def _block_rows(b: int, n_heads: int, n_k: int) -> int:
    return max(_MIN_BLOCK_ROWS, _BLOCK_ELEMENTS // max(1, b * n_heads * n_k))


def _causal_attention(q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """ "causal" with the queries at the end of the keys (n_q <= n_k): blocks of query rows,
    each against only the keys it can see; no [rows x keys] mask is built or applied."""
    b, n_heads, n_q, dim = q.shape
    n_kv = int(k.shape[1])
    rep = n_heads // n_kv
    n_k = int(k.shape[2])
    past = n_k - n_q
    if v.dtype != q.dtype:
        v = v.astype(q.dtype)
    if n_q >= _ONES_COLUMN_QUERIES:
        v = mx.concatenate([v, mx.ones((*v.shape[:-1], 1), dtype=v.dtype)], axis=-1)
    rows = min(n_q, _block_rows(b, n_heads, n_k))
    tri = mx.tril(mx.ones((rows, rows), dtype=mx.bool_))
    outs = []
    for start in range(0, n_q, rows):
        stop = min(start + rows, n_q)
        qg = _grouped_rows(q[:, :, start:stop], n_kv, scale)
        t = tri if stop - start == rows else tri[: stop - start, : stop - start]
        outs.append(_causal_block(qg, k, v, past + start, t, rep, dim).reshape(b, n_heads, -1, dim))
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any = None) -> mx.array:
    """Softmax(q k^T * scale + mask) v with the fast exponential. q [B, H, L, D];
    k, v [B, H_kv, S, D] (H a multiple of H_kv); mask None, "causal" or an array.
    Long query runs (prefill chunks) go in blocks of rows so each block's scores fit in
    cache; rows are independent, so blocking does not change the result. "causal" with
    L <= S takes the split path (unmasked past + masked diagonal); other masks are applied
    to each block's rows."""
    b, n_heads, n_q, _ = q.shape
    n_k = int(k.shape[2])
    if n_q * n_k < _SMALL:  # one query over a short context: the fused call's lower overhead wins
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    if isinstance(mask, str) and mask == "causal" and n_q <= n_k:
        return _causal_attention(q, k, v, scale)
    rows = _block_rows(b, n_heads, n_k)
    if n_q <= rows:
        return _fused_block(q, k, v, scale, _scores_mask(mask, n_q, n_k))
    full = _scores_mask(mask, n_q, n_k)
    outs = []
    for start in range(0, n_q, rows):
        stop = min(start + rows, n_q)
        part = None if full is None else full[..., start:stop, :]
        outs.append(_fused_block(q[:, :, start:stop], k, v, scale, part))
    return mx.concatenate(outs, axis=2)


def baseline_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any = None
) -> mx.array:
    """The previous kernel (full mask per block, softmax, then P @ V), kept so the benchmark
    can show both side by side."""
    b, n_heads, n_q, _ = q.shape
    n_k = int(k.shape[2])
    if n_q * n_k < _SMALL:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    rows = _block_rows(b, n_heads, n_k)
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


def composed_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any = None
) -> mx.array:
    """Attention composed of MLX ops (scores, MLX's precise softmax, P @ V), as MLX computes
    it where no fused kernel applies: no kernel specialised to the call's shapes."""
    return _attention(q, k, v, scale, mask, None)


# The most queries a forward attends with through `composed_attention` on CUDA: verify and
# draft blocks (at most a block per row); prefill chunks are longer.
SHORT_QUERIES = 64


def composed_attention_enabled() -> bool:
    """Whether forwards of 2..SHORT_QUERIES queries use `composed_attention`: on MLX's CUDA
    backend, unless TOOLFLASH_COMPOSED_ATTENTION=0. There MLX's fused call for more than one
    query runs cuDNN, which builds an execution graph for every exact shape it meets (cached
    per shape; tens of ms to build), and each decode cycle attends over a key length it has
    not met: a spec cycle cost 5x more (benchmarks/results/README.md, "cuDNN graphs").
    Prefill chunks keep cuDNN's flash attention, which is 2.4x faster there."""
    if os.environ.get("TOOLFLASH_COMPOSED_ATTENTION", "1") == "0":
        return False
    return bool(mx.default_device() == mx.gpu and mx.cuda.is_available())


def fast_attention_enabled() -> bool:
    """Whether targets use `attention` instead of MLX's fused kernel: on the CPU backend,
    unless TOOLFLASH_FAST_ATTENTION=0."""
    if os.environ.get("TOOLFLASH_FAST_ATTENTION", "1") == "0":
        return False
    return bool(mx.default_device() == mx.cpu)
