"""The CPU attention kernel against MLX's fused attention and its own mx.exp reference."""

from __future__ import annotations

import mlx.core as mx
import pytest

from toolflash.kernels.attention import (
    attention,
    baseline_attention,
    composed_attention,
    composed_attention_enabled,
    exp_nonpositive,
    exp_shifted,
    fast_attention_enabled,
    reference_attention,
)


def test_fast_exp_matches_mx_exp_on_softmax_inputs() -> None:
    x = -mx.abs(mx.random.normal((64, 4096), key=mx.random.key(0)) * 12)
    x = mx.concatenate([x, mx.array([[-mx.inf] * 4096])], axis=0)
    got, ref = exp_nonpositive(x), mx.exp(x)
    live = ref > 1e-30
    rel = mx.where(live, mx.abs(got - ref) / mx.maximum(ref, 1e-30), 0.0)
    assert mx.max(rel).item() < 2e-5
    assert mx.max(got[-1]).item() < 1e-37  # -inf (a masked score) becomes ~0


@pytest.mark.parametrize(
    "n_q, n_k, heads, kv_heads, mask",
    [
        (1, 300, 4, 2, None),  # AR step with a cache
        (16, 300, 4, 2, "causal"),  # verify block after a cache
        (64, 64, 4, 4, "causal"),  # prefill, no GQA
        (40, 700, 8, 2, "causal"),
        (300, 2000, 4, 2, "causal"),  # a prefill chunk long enough to be split in blocks
    ],
)
def test_matches_mlx_fused_attention(
    n_q: int, n_k: int, heads: int, kv_heads: int, mask: str | None
) -> None:
    keys = mx.random.split(mx.random.key(n_q * 7 + n_k), 3)
    q = mx.random.normal((1, heads, n_q, 64), key=keys[0])
    k = mx.random.normal((1, kv_heads, n_k, 64), key=keys[1])
    v = mx.random.normal((1, kv_heads, n_k, 64), key=keys[2])
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
    assert mx.allclose(attention(q, k, v, 0.125, mask), fused, atol=2e-5).item()
    assert mx.allclose(reference_attention(q, k, v, 0.125, mask), fused, atol=2e-6).item()
    assert mx.allclose(composed_attention(q, k, v, 0.125, mask), fused, atol=2e-6).item()


def _qkv(
    n_q: int, n_k: int, heads: int, kv_heads: int, dim: int = 64, seed: int = 0
) -> tuple[mx.array, mx.array, mx.array]:
    keys = mx.random.split(mx.random.key(seed * 1009 + n_q * 7 + n_k), 3)
    q = mx.random.normal((1, heads, n_q, dim), key=keys[0])
    k = mx.random.normal((1, kv_heads, n_k, dim), key=keys[1])
    v = mx.random.normal((1, kv_heads, n_k, dim), key=keys[2])
    return q, k, v


def test_exp_shifted_matches_mx_exp_of_the_difference() -> None:
    s = mx.random.normal((64, 4096), key=mx.random.key(5)) * 12
    s = mx.concatenate([s, mx.array([[-mx.inf] * 4095 + [0.0]])], axis=0)
    m = mx.max(s, axis=-1, keepdims=True)
    got, ref = exp_shifted(s, m), mx.exp(s - m)
    live = ref > 1e-30
    rel = mx.where(live, mx.abs(got - ref) / mx.maximum(ref, 1e-30), 0.0)
    assert mx.max(rel).item() < 2e-5
    assert mx.max(got[-1, :-1]).item() < 1e-37  # -inf (a masked score) becomes ~0
    assert got[-1, -1].item() == 1.0


@pytest.mark.parametrize(
    "n_q, n_k, heads, kv_heads",
    [
        (16, 1024, 4, 2),  # verify blocks over 1k..10k keys: one block, past + causal diagonal
        (16, 10240, 4, 2),
        (40, 40, 4, 2),  # past = 0, one block
        (512, 512, 4, 2),  # prefill from position 0: several blocks, no past before the chunk
        (100, 3000, 4, 2),  # past > 0, several blocks, a short last block, ones column on
        (63, 2000, 8, 2),  # just below the ones-column threshold, rep 4
        (64, 2000, 4, 4),  # just at it, no GQA
        (512, 9000, 4, 2),  # the long-context prefill chunk the split is for
    ],
)
def test_causal_split_matches_mlx_fused(n_q: int, n_k: int, heads: int, kv_heads: int) -> None:
    q, k, v = _qkv(n_q, n_k, heads, kv_heads)
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert mx.allclose(attention(q, k, v, 0.125, "causal"), fused, atol=2e-5).item()
    assert mx.allclose(baseline_attention(q, k, v, 0.125, "causal"), fused, atol=2e-5).item()


def test_causal_split_on_a_cache_slice_with_large_scores() -> None:
    # K/V as mlx-lm's KVCache returns them (a prefix of a larger buffer), scores far from 0.
    q, k, v = _qkv(200, 3000, 4, 2, seed=1)
    k_buf = mx.concatenate([k, mx.zeros((1, 2, 256, 64))], axis=2)
    v_buf = mx.concatenate([v, mx.zeros((1, 2, 256, 64))], axis=2)
    k_view, v_view = k_buf[:, :, :3000], v_buf[:, :, :3000]
    fused = mx.fast.scaled_dot_product_attention(q * 4, k, v, scale=0.125, mask="causal")
    got = attention(q * 4, k_view, v_view, 0.125, "causal")
    assert mx.allclose(got, fused, atol=2e-5).item()


@pytest.mark.parametrize("n_q, n_k", [(300, 2000), (16, 1500)])
def test_array_masks_in_blocks_match_mlx_fused(n_q: int, n_k: int) -> None:
    q, k, v = _qkv(n_q, n_k, 4, 2, seed=2)
    allowed = mx.random.uniform(shape=(n_q, n_k), key=mx.random.key(9)) > 0.5
    allowed[:, 0] = True
    for mask in (allowed, mx.where(allowed, 0.0, -mx.inf)):
        fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
        assert mx.allclose(attention(q, k, v, 0.125, mask), fused, atol=2e-5).item()
    # A per-head [B, H, L, S] mask (as mlx-lm builds one) splits like the grouped queries.
    per_head = mx.random.uniform(shape=(1, 4, n_q, n_k), key=mx.random.key(10)) > 0.3
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=per_head)
    assert mx.allclose(attention(q, k, v, 0.125, per_head), fused, atol=2e-5).item()


def test_no_mask_prefill_in_blocks() -> None:
    q, k, v = _qkv(300, 2000, 4, 2, seed=3)
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125)
    assert mx.allclose(attention(q, k, v, 0.125), fused, atol=2e-5).item()


def test_a_row_with_no_visible_key_gets_uniform_weights_like_mlx_fused() -> None:
    q, k, v = _qkv(8, 400, 4, 2, seed=4)
    allowed = mx.ones((8, 400), dtype=mx.bool_)
    allowed[3, :] = False
    allowed[5, 100:] = False
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=allowed)
    got = attention(q, k, v, 0.125, allowed)
    assert not mx.any(mx.isnan(got)).item()
    assert mx.allclose(got, fused, atol=2e-5).item()


def test_boolean_and_additive_array_masks() -> None:
    keys = mx.random.split(mx.random.key(3), 4)
    q = mx.random.normal((1, 4, 8, 32), key=keys[0])
    k = mx.random.normal((1, 2, 20, 32), key=keys[1])
    v = mx.random.normal((1, 2, 20, 32), key=keys[2])
    allowed = mx.random.uniform(shape=(8, 20), key=keys[3]) > 0.3
    allowed[:, 0] = True  # every row sees something
    additive = mx.where(allowed, 0.0, -mx.inf)
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=allowed)
    assert mx.allclose(attention(q, k, v, 0.2, allowed), fused, atol=2e-5).item()
    assert mx.allclose(attention(q, k, v, 0.2, additive), fused, atol=2e-5).item()
    for mask in (allowed, additive):
        assert mx.allclose(composed_attention(q, k, v, 0.2, mask), fused, atol=2e-6).item()


def test_a_padding_mask_shared_by_every_query() -> None:
    """A batch's [B, 1, 1, S] mask (left padding, one row for all queries, as a drafter's
    block attends) stays broadcast over the grouped queries."""
    keys = mx.random.split(mx.random.key(11), 4)
    q = mx.random.normal((2, 8, 16, 32), key=keys[0])
    k = mx.random.normal((2, 2, 151, 32), key=keys[1])
    v = mx.random.normal((2, 2, 151, 32), key=keys[2])
    padding = mx.arange(151)[None, None, None, :] >= mx.array([0, 40])[:, None, None, None]
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=padding)
    assert mx.allclose(composed_attention(q, k, v, 0.125, padding), fused, atol=2e-6).item()
    assert mx.allclose(attention(q, k, v, 0.125, padding), fused, atol=2e-5).item()


def test_composed_attention_in_bfloat16_stays_close_to_fused() -> None:
    """On CUDA the model's bf16 verify blocks run it: MLX's precise softmax keeps it close."""
    q, k, v = (a.astype(mx.bfloat16) for a in _qkv(16, 300, 8, 2, seed=6))
    fused = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    got = composed_attention(q, k, v, 0.125, "causal")
    assert got.dtype == mx.bfloat16
    assert mx.allclose(got.astype(mx.float32), fused.astype(mx.float32), atol=2e-2).item()


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLASH_FAST_ATTENTION", "0")
    assert not fast_attention_enabled()
    monkeypatch.setenv("TOOLFLASH_FAST_ATTENTION", "1")
    assert fast_attention_enabled() == (mx.default_device() == mx.cpu)
    on_cuda = mx.default_device() == mx.gpu and mx.cuda.is_available()
    assert composed_attention_enabled() == on_cuda
    monkeypatch.setenv("TOOLFLASH_COMPOSED_ATTENTION", "0")
    assert not composed_attention_enabled()
