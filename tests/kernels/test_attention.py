"""The CPU attention kernel against MLX's fused attention and its own mx.exp reference."""

from __future__ import annotations

import mlx.core as mx
import pytest

from toolflash.kernels.attention import (
    attention,
    exp_nonpositive,
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


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLASH_FAST_ATTENTION", "0")
    assert not fast_attention_enabled()
    monkeypatch.setenv("TOOLFLASH_FAST_ATTENTION", "1")
    assert fast_attention_enabled() == (mx.default_device() == mx.cpu)
