"""Attention forwards whose RoPE position is decoupled from the KV cache length.

Positional sparse prefill keeps only some prompt tokens in the cache but must rotate every
kept token (and every later token) at its true position: position = cache.offset + shift.
On the CPU, dense sessions use them too, with shift 0, to swap in toolflash's attention kernel
(`toolflash.kernels.attention`: a fast softmax; MLX's CPU exp dominates long contexts).
These are copies of mlx-lm 0.32's `qwen3.Attention.__call__` and
`qwen3_next.Qwen3NextAttention.__call__` with that one change; with shift 0 they equal the
originals (tests/engine/test_sparse.py pins this).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import scaled_dot_product_attention

from toolflash.kernels.attention import Attention


def _sdpa(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    attn: Any,
    mask: Any,
    cache: Any,
    kernel: Attention | None,
) -> mx.array:
    if kernel is not None:
        return kernel(queries, keys, values, attn.scale, mask)
    return scaled_dot_product_attention(
        queries, keys, values, cache=cache, scale=attn.scale, mask=mask
    )


def qwen3_attention_at(
    attn: Any, x: mx.array, mask: Any, cache: Any, shift: int, kernel: Attention | None = None
) -> mx.array:
    """mlx-lm Qwen3 attention with RoPE at cache.offset + shift (and `kernel` in place of
    MLX's fused attention when given)."""
    b, n, _ = x.shape
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    queries = attn.q_norm(queries.reshape(b, n, attn.n_heads, -1)).transpose(0, 2, 1, 3)
    keys = attn.k_norm(keys.reshape(b, n, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
    values = values.reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    position = cache.offset + shift
    queries = attn.rope(queries, offset=position)
    keys = attn.rope(keys, offset=position)
    keys, values = cache.update_and_fetch(keys, values)
    out = _sdpa(queries, keys, values, attn, mask, cache, kernel)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


def qwen3_next_attention_at(
    attn: Any, x: mx.array, mask: Any, cache: Any, shift: int, kernel: Attention | None = None
) -> mx.array:
    """mlx-lm Qwen3-Next/3.5 gated attention with RoPE at cache.offset + shift (and `kernel`
    in place of MLX's fused attention when given)."""
    b, n, _ = x.shape
    queries, gate = mx.split(attn.q_proj(x).reshape(b, n, attn.num_attention_heads, -1), 2, axis=-1)
    gate = gate.reshape(b, n, -1)
    keys, values = attn.k_proj(x), attn.v_proj(x)
    queries = attn.q_norm(queries).transpose(0, 2, 1, 3)
    keys = attn.k_norm(keys.reshape(b, n, attn.num_key_value_heads, -1)).transpose(0, 2, 1, 3)
    values = values.reshape(b, n, attn.num_key_value_heads, -1).transpose(0, 2, 1, 3)
    position = cache.offset + shift
    queries = attn.rope(queries, offset=position)
    keys = attn.rope(keys, offset=position)
    keys, values = cache.update_and_fetch(keys, values)
    out = _sdpa(queries, keys, values, attn, mask, cache, kernel)
    out = out.transpose(0, 2, 1, 3).reshape(b, n, -1)
    return attn.o_proj(out * mx.sigmoid(gate))
