"""Target adapters against mlx-lm's own forward, and the drafter context window."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from toolflash.engine.draft_context import DraftContext, DraftWindow
from toolflash.engine.targets.base import training_logits
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target, gated_delta_forward
from toolflash.kernels import gated_delta
from toolflash.kernels.training_math import FAST, REFERENCE, TrainingMath

from .tiny_models import drafter_for, qwen3_target, qwen35_target

TOKENS = [[5, 9, 200, 31, 7, 7, 64, 3, 150, 2, 99, 18]]


@pytest.mark.parametrize(
    "make,adapter_cls", [(qwen3_target, Qwen3Target), (qwen35_target, Qwen35Target)]
)
def test_adapter_logits_match_mlx_lm(make, adapter_cls) -> None:  # type: ignore[no-untyped-def]
    model = make()
    adapter = adapter_cls(model)
    ref_cache = make_prompt_cache(model)
    ref = model(mx.array(TOKENS), cache=ref_cache)
    cache = adapter.make_cache()
    out = adapter.forward(mx.array(TOKENS), cache, capture=(1, 2))
    assert mx.allclose(out.logits, ref, atol=1e-4).item()
    assert out.features is not None and out.features.shape == (1, 12, 2 * adapter.hidden_size)
    # Decode steps after prefill agree too (cache layouts are mlx-lm's own).
    ref_step = model(mx.array([[42]]), cache=ref_cache)
    step = adapter.forward(mx.array([[42]]), cache).logits
    assert mx.allclose(step, ref_step, atol=1e-4).item()


@pytest.mark.parametrize(
    "make,adapter_cls", [(qwen3_target, Qwen3Target), (qwen35_target, Qwen35Target)]
)
def test_short_query_kernel_takes_verify_blocks_only(make, adapter_cls) -> None:  # type: ignore[no-untyped-def]
    """Where there is a short-query kernel (CUDA: composed attention, no per-shape cuDNN
    graph), forwards of 2..SHORT_QUERIES tokens use it and give the same logits; AR steps
    and prefill chunks keep the other kernels."""
    from toolflash.kernels.attention import SHORT_QUERIES, composed_attention

    model = make()
    plain, short = adapter_cls(model), adapter_cls(model)
    short.short_query_kernel = composed_attention
    for queries, want in ((1, False), (2, True), (SHORT_QUERIES, True), (SHORT_QUERIES + 1, False)):
        assert (short.kernel_for("causal", queries) is composed_attention) == want
    caches = [plain.make_cache(), short.make_cache()]
    for tokens in (TOKENS, [[42]], [[7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]):
        got = [a.forward(mx.array(tokens), c).logits for a, c in zip((plain, short), caches)]
        assert mx.allclose(got[0], got[1], atol=1e-4).item()


@pytest.mark.parametrize(
    "make,adapter_cls", [(qwen3_target, Qwen3Target), (qwen35_target, Qwen35Target)]
)
def test_short_query_kernel_on_left_padded_batch_verify(make, adapter_cls) -> None:  # type: ignore[no-untyped-def]
    """A batched verify block (rows of unequal length: an array mask) through the short-query
    kernel gives the logits the other kernels give."""
    from toolflash.kernels.attention import composed_attention

    model = make()
    plain, short = adapter_cls(model), adapter_cls(model)
    short.short_query_kernel = composed_attention
    block = mx.array([[42, 7, 9, 11], [43, 8, 10, 12], [44, 5, 6, 13]])
    logits = []
    for adapter in (plain, short):
        caches = []
        for r in range(3):
            caches.append(adapter.make_cache())
            adapter.forward(
                mx.array([[(7 * i + 3 + r) % 250 for i in range(20 - 5 * r)]]), caches[-1]
            )
        merged = [type(c).merge([row[j] for row in caches]) for j, c in enumerate(caches[0])]
        logits.append(adapter.forward(block, merged).logits)
    assert mx.allclose(logits[0], logits[1], atol=1e-4).item()


def test_gated_delta_forward_matches_mlx_lm_layer() -> None:
    model = qwen35_target()
    adapter = Qwen35Target(model)
    layer = next(lyr for lyr in adapter.layers if lyr.is_linear).linear_attn
    x = mx.random.normal((1, 9, adapter.hidden_size))
    ref_cache, cache = make_prompt_cache(model)[0], make_prompt_cache(model)[0]
    ref = layer(x, None, ref_cache)
    out, tape = gated_delta_forward(layer, x, cache, keep_tape=True)
    assert mx.allclose(out, ref, atol=1e-4).item()
    assert mx.allclose(cache[1], ref_cache[1], atol=1e-5).item()
    assert mx.allclose(cache[0], ref_cache[0]).item()
    assert tape is not None and len(tape.states) == 9


@pytest.mark.parametrize("ops", [FAST, REFERENCE], ids=lambda o: o.name)
@pytest.mark.parametrize(
    "make,adapter_cls", [(qwen3_target, Qwen3Target), (qwen35_target, Qwen35Target)]
)
def test_training_logits_match_mlx_lm_and_carry_gradients(  # type: ignore[no-untyped-def]
    make, adapter_cls, ops: TrainingMath
) -> None:
    model = make()
    tokens = mx.random.randint(0, 64, (3, 40))  # a batch, longer than one 16-token chunk
    got = training_logits(adapter_cls(model), tokens, ops)
    assert mx.allclose(got, model(tokens), atol=1e-4).item()

    def loss(m: nn.Module, x: mx.array) -> mx.array:
        return training_logits(adapter_cls(m), x, ops).astype(mx.float32).mean()

    def ref_loss(m: nn.Module, x: mx.array) -> mx.array:
        return m(x).astype(mx.float32).mean()

    _, grads = nn.value_and_grad(model, loss)(model, tokens)
    _, ref_grads = nn.value_and_grad(model, ref_loss)(model, tokens)
    ours, theirs = dict(tree_flatten(grads)), dict(tree_flatten(ref_grads))
    assert ours.keys() == theirs.keys()
    for name, g in ours.items():
        assert mx.allclose(g, theirs[name], atol=1e-4, rtol=1e-3).item(), name


def test_recurrence_states_are_prefix_states() -> None:
    mx.random.seed(3)
    b, t, hk, hv, dk, dv = 1, 6, 2, 4, 32, 16
    q = mx.random.normal((b, t, hk, dk))
    k = mx.random.normal((b, t, hk, dk)) * 0.1
    v = mx.random.normal((b, t, hv, dv))
    g = mx.random.uniform(shape=(b, t, hv))
    beta = mx.random.uniform(shape=(b, t, hv))
    s0 = mx.zeros((b, hv, dv, dk))
    _, states = gated_delta.recurrence_ops(q, k, v, g, beta, s0, keep_states=True)
    for n in range(1, t + 1):
        _, final = gated_delta.recurrence_ops(
            q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n], s0, keep_states=False
        )
        assert mx.allclose(states[n - 1], final[-1]).item()


def test_draft_window_keeps_sink_and_tail() -> None:
    model = qwen3_target()
    drafter = drafter_for(model)
    window = DraftWindow(sink=3, window=5)
    assert window.keeps(6) == [(0, 6)]
    assert window.keeps(20) == [(0, 3), (15, 20)]
    ctx = DraftContext(drafter, window)
    feats = mx.random.normal((1, 20, 2 * 64))
    ctx.add_features(feats[:, :7])
    ctx.add_features(feats[:, 7:20])
    kv = ctx.absorb()
    assert ctx.covered == 20
    assert kv[0][0].shape[2] == 8
    # The retained rows are exactly those computed for positions 0..2 and 15..19.
    full = drafter.context_kv(drafter.fuse(feats), 0)[0][0]
    expect = mx.concatenate([full[:, :, :3], full[:, :, 15:]], axis=2)
    assert mx.allclose(kv[0][0], expect, atol=1e-5).item()
    # Later appends keep the window sliding.
    ctx.add_features(mx.random.normal((1, 2, 2 * 64)))
    kv = ctx.absorb()
    assert kv[0][0].shape[2] == 8 and ctx.covered == 22


def test_sliding_mask_limits_context_and_is_causal_in_block() -> None:
    from toolflash.engine.drafter import sliding_mask

    positions = mx.array([0, 1, 2, 7, 8, 9])  # sink 0..2, tail 7..9; block starts at 10
    m = sliding_mask(10, 3, positions, window=4)
    rows = [[bool(x) for x in row] for row in m.tolist()]
    # query at 10 sees context 7,8,9 (10 - p < 4) and block key 0 only
    assert rows[0] == [False, False, False, True, True, True, True, False, False]
    # query at 12 sees context 9 only, block keys 0..2
    assert rows[2] == [False, False, False, False, False, True, True, True, True]


def test_drafter_composed_attention_gives_the_same_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drafter's block attention composed (as on CUDA) equals the fused call's."""
    import toolflash.engine.drafter as drafter_module

    attn = drafter_for(qwen3_target()).eval().layers[0].self_attn  # inference, as served
    hidden = attn.q_proj.weight.shape[1]
    keys = mx.random.split(mx.random.key(5), 2)
    block, ctx = (
        mx.random.normal((2, 8, hidden), key=keys[0]),
        mx.random.normal((2, 30, hidden), key=keys[1]),
    )
    ctx_k, ctx_v = attn.context_kv(ctx, 0)
    monkeypatch.setattr(drafter_module, "fast_attention_enabled", lambda: False)
    outs = []
    for composed in (False, True):
        monkeypatch.setattr(drafter_module, "composed_attention_enabled", lambda c=composed: c)
        outs.append(attn(block, 30, ctx_k, ctx_v))
    assert mx.allclose(outs[0], outs[1], atol=1e-5).item()


def test_drafter_with_sliding_layers_stays_lossless() -> None:
    from toolflash.engine.drafter import DFlashDrafter, DraftConfig
    from toolflash.engine.session import GenerationSession

    model = qwen3_target()
    base = drafter_for(model)
    raw = dict(base.config.to_dict(), layer_types=["sliding_attention"], sliding_window=6)
    drafter = DFlashDrafter(DraftConfig.from_dict(raw))
    mx.eval(drafter.parameters())
    outs = []
    for mode in ("ar", "spec"):
        s = GenerationSession(Qwen3Target(model), drafter, window=DraftWindow(sink=2, window=8))
        s.prefill(TOKENS[0])
        while len(s.tokens) < 12 + 40:
            s.step(mode, 8, lambda c: None)  # type: ignore[arg-type]
        outs.append(s.tokens[:52])
    assert outs[0] == outs[1]


@pytest.mark.parametrize(
    "make,adapter_cls", [(qwen3_target, Qwen3Target), (qwen35_target, Qwen35Target)]
)
def test_left_padded_batch_rows_match_mlx_lm_with_either_kernel(make, adapter_cls) -> None:  # type: ignore[no-untyped-def]
    """Batch rows of unequal length (an array mask): small masks take MLX's fused call, large
    ones toolflash's kernel; both give mlx-lm's own batched logits."""
    from mlx_lm.models.cache import BatchKVCache

    from toolflash.engine.targets.base import SMALL_ARRAY_MASK

    model = make()
    adapter = adapter_cls(model)
    assert adapter.kernel_for(None, 1) is adapter.attention_kernel
    for length in (8, 800):  # rows x keys below and above SMALL_ARRAY_MASK
        prompts = [[(7 * i + 3 + r) % 250 for i in range(length - 2 * r)] for r in range(3)]
        ref_caches, caches = [], []
        for p in prompts:
            ref_caches.append(make_prompt_cache(model))
            model(mx.array([p]), cache=ref_caches[-1])
            caches.append(adapter.make_cache())
            adapter.forward(mx.array([p]), caches[-1])
        merged_ref = [
            type(c).merge([r[j] for r in ref_caches]) for j, c in enumerate(ref_caches[0])
        ]
        merged = [type(c).merge([r[j] for r in caches]) for j, c in enumerate(caches[0])]
        step = mx.array([[42], [43], [44]])
        ref = model(step, cache=merged_ref)
        out = adapter.forward(step, merged).logits
        assert mx.allclose(out, ref, atol=1e-4).item()
        mask_size = 3 * (length + 1)
        attention_layer = next(c for c in merged if isinstance(c, BatchKVCache))
        mask = attention_layer.make_mask(1, return_array=True)
        big = mask_size >= SMALL_ARRAY_MASK
        assert big == (length == 800)
        assert (adapter.kernel_for(mask, 1) is adapter.attention_kernel) == big
