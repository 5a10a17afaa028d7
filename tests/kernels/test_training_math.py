"""The CPU-fast training operations against MLX's own: values and gradients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest

from toolflash.kernels import training_math
from toolflash.kernels.training_math import FAST, REFERENCE, logsumexp, silu, softmax


def _key(seed: int) -> mx.array:
    return mx.random.key(seed)


def _check_grad(
    fast: Callable[[mx.array], mx.array], ref: Callable[[mx.array], mx.array], x: mx.array
) -> None:
    weights = mx.random.normal(fast(x).shape, key=_key(99))
    g = mx.grad(lambda a: (fast(a) * weights).sum())(x)
    g_ref = mx.grad(lambda a: (ref(a) * weights).sum())(x)
    assert mx.allclose(g, g_ref, rtol=1e-4, atol=1e-5).item()


def test_softmax_and_logsumexp_match_mlx_with_gradients() -> None:
    x = mx.random.normal((64, 1000), key=_key(0)) * 8
    x = mx.concatenate([x, mx.full((1, 1000), -1e30)])  # a row far below exp's range
    assert mx.allclose(softmax(x), mx.softmax(x, axis=-1), rtol=2e-5, atol=1e-7).item()
    assert mx.allclose(logsumexp(x), mx.logsumexp(x, axis=-1), rtol=1e-6, atol=1e-5).item()
    _check_grad(softmax, lambda a: mx.softmax(a, axis=-1), x[:-1])
    _check_grad(logsumexp, lambda a: mx.logsumexp(a, axis=-1), x[:-1])


def test_silu_matches_mlx_over_the_whole_range_with_gradients() -> None:
    x = mx.concatenate([mx.random.normal((4096,), key=_key(1)) * 6, mx.array([-200.0, 0.0, 90.0])])
    assert mx.allclose(silu(x), nn.silu(x), rtol=2e-5, atol=1e-6).item()
    _check_grad(silu, nn.silu, x)


def test_cross_entropy_matches_mlx() -> None:
    logits = mx.random.normal((3, 7, 500), key=_key(2)) * 5
    labels = mx.random.randint(0, 500, (3, 7), key=_key(3))
    got, ref = FAST.cross_entropy(logits, labels), REFERENCE.cross_entropy(logits, labels)
    assert got.shape == (3, 7) and mx.allclose(got, ref, rtol=1e-5, atol=1e-5).item()
    _check_grad(
        lambda z: FAST.cross_entropy(z, labels),
        lambda z: REFERENCE.cross_entropy(z, labels),
        logits,
    )


def _masks(b: int, heads: int, n_q: int, n_k: int) -> list[Any]:
    visible = mx.random.uniform(shape=(b, 1, 1, n_k), key=_key(4)) > 0.3
    per_head = mx.random.uniform(shape=(b, heads, n_q, n_k), key=_key(5)) > 0.5
    additive = mx.where(per_head, 0.0, -1e9)
    return [None, "causal", visible, per_head, additive]


@pytest.mark.parametrize("mask_index", range(5))
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_attention_matches_mlx_fused_attention_with_gradients(
    mask_index: int, heads: int, kv_heads: int
) -> None:
    b, n_q, n_k, dim = 2, 16, 40, 32
    keys = mx.random.split(_key(6 + heads), 3)
    q = mx.random.normal((b, heads, n_q, dim), key=keys[0])
    k = mx.random.normal((b, kv_heads, n_k, dim), key=keys[1])
    v = mx.random.normal((b, kv_heads, n_k, dim), key=keys[2])
    mask = _masks(b, heads, n_q, n_k)[mask_index]
    got = FAST.attention(q, k, v, 0.2, mask)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)
    assert mx.allclose(got, ref, rtol=1e-4, atol=2e-5).item()
    w = mx.random.normal(ref.shape, key=_key(7))

    def grads(attend: Callable[..., mx.array]) -> tuple[mx.array, ...]:
        loss = lambda a, b_, c: (attend(a, b_, c, 0.2, mask) * w).sum()  # noqa: E731
        return tuple(mx.grad(loss, argnums=(0, 1, 2))(q, k, v))

    for g, g_ref in zip(grads(FAST.attention), grads(REFERENCE.attention)):
        assert mx.allclose(g, g_ref, rtol=1e-3, atol=1e-4).item()


def test_switch_picks_fast_only_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLASH_FAST_ATTENTION", "0")
    assert training_math.training_math() is REFERENCE
    monkeypatch.setenv("TOOLFLASH_FAST_ATTENTION", "1")
    expected = FAST if mx.default_device() == mx.cpu else REFERENCE
    assert training_math.training_math() is expected
