"""The training forward equals the drafter's inference path, sees nothing it must not, and a
short run writes a drafter the engine loads and runs losslessly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from toolflash.engine.draft_context import DraftContext, DraftWindow
from toolflash.engine.draft_loading import TargetInfo, load_draft, save_draft
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target
from toolflash.training.data import TrainingExample, distill
from toolflash.training.draft_config import draft_config_for, init_drafter
from toolflash.training.generation import generate
from toolflash.training.objective import build_blocks
from toolflash.training.trainer import (
    StepInputs,
    TrainConfig,
    collate,
    target_features,
    train_drafter,
)

from ..engine.tiny_models import VOCAB, qwen3_target, qwen35_target
from .helpers import random_prompts

MASK = VOCAB - 1
FAMILIES = {"qwen3": (qwen3_target, Qwen3Target), "qwen3_5": (qwen35_target, Qwen35Target)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def target(request: Any) -> Any:
    make, adapter = FAMILIES[request.param]
    return adapter(make())


def _drafter(target: Any, seed: int = 0) -> Any:
    return init_drafter(draft_config_for(target, MASK, layers=1, block_size=8), seed)


def _example(seed: int = 0, length: int = 40, prompt: int = 10) -> TrainingExample:
    rng = np.random.default_rng(seed)
    return TrainingExample(rng.integers(0, MASK, size=length).astype(np.int32), prompt)


def _block_hidden(drafter: Any, target: Any, inputs: StepInputs) -> mx.array:
    """The training forward of `draft_loss` up to the drafter's hidden states."""
    fused = drafter.fuse(inputs.features)
    ctx = [(k[inputs.seq_index], v[inputs.seq_index]) for k, v in drafter.context_kv(fused, 0)]
    return drafter.denoise(target.embed(inputs.block_ids), inputs.anchors, ctx, inputs.mask)


def _inputs(target: Any, drafter: Any, examples: list[TrainingExample], n: int = 6) -> Any:
    feats = target_features(target, drafter.config.target_layer_ids, examples)
    rng = np.random.default_rng(1)
    return feats, collate(examples, feats, n, 8, MASK, 4.0, rng, context_bucket=64)


def test_training_forward_equals_inference_path(target: Any) -> None:
    """Each block's hidden states in training equal what the session's drafter computes when
    that block is drafted at inference: context = target features of positions < anchor,
    block at positions anchor.. (catches feature shifts, label/position offsets, mask leaks)."""
    drafter = _drafter(target)
    examples = [_example(0), _example(1, length=30, prompt=6)]
    feats, inputs = _inputs(target, drafter, examples)
    hidden = _block_hidden(drafter, target, inputs)
    anchors = np.array(inputs.anchors).tolist()
    seqs = np.array(inputs.seq_index).tolist()
    for row, (a, s) in enumerate(zip(anchors, seqs)):
        ctx = DraftContext(drafter, DraftWindow(window=None))
        ctx.add_features(feats[s][None, :a])
        block = mx.array([[int(examples[s].tokens[a])] + [MASK] * 7])
        served = drafter.denoise(target.embed(block), a, ctx.absorb())
        assert mx.allclose(served[0], hidden[row], atol=1e-4).item(), f"block at anchor {a}"


def test_block_sees_nothing_at_or_after_its_anchor(target: Any) -> None:
    drafter = _drafter(target)
    ex = _example(2)
    feats, inputs = _inputs(target, drafter, [ex])
    base = _block_hidden(drafter, target, inputs)
    anchors = np.array(inputs.anchors).tolist()
    row = len(anchors) // 2
    a = anchors[row]
    # Perturb the context row of the anchor itself and everything after it.
    noise = mx.random.normal(inputs.features.shape, key=mx.random.key(0))
    after = (mx.arange(inputs.features.shape[1]) >= a)[None, :, None]
    perturbed = StepInputs(mx.where(after, noise, inputs.features), *inputs.arrays()[1:])
    out = _block_hidden(drafter, target, perturbed)
    assert mx.allclose(out[row], base[row], atol=1e-5).item()
    later = [i for i, x in enumerate(anchors) if x > a]
    assert later and not mx.allclose(out[later[-1]], base[later[-1]], atol=1e-3).item()


def test_anchor_inclusive_context_leaks_the_anchor_row(target: Any) -> None:
    """The distinguishable outcome of pitfall 3: with an inclusive mask the block's output
    depends on the anchor's own target state; with ours it does not (previous test)."""
    drafter = _drafter(target)
    ex = _example(3)
    _, inputs = _inputs(target, drafter, [ex])
    a = int(inputs.anchors[0].item())
    s = inputs.mask.shape[-1] - 8
    inclusive = np.array(inputs.mask)
    inclusive[:, 0, 0, :s] = np.arange(s)[None, :] <= np.array(inputs.anchors)[:, None]
    leaky = StepInputs(
        inputs.features,
        inputs.seq_index,
        inputs.block_ids,
        inputs.anchors,
        mx.array(inclusive),
        inputs.labels,
        inputs.weights,
    )
    base = _block_hidden(drafter, target, leaky)
    bump = mx.zeros(inputs.features.shape).at[:, a].add(3.0)
    moved = StepInputs(inputs.features + bump, *leaky.arrays()[1:])
    assert not mx.allclose(_block_hidden(drafter, target, moved)[0], base[0], atol=1e-3).item()


def test_overlapping_blocks_do_not_see_each_other(target: Any) -> None:
    drafter = _drafter(target)
    ex = _example(4)
    feats = target_features(target, drafter.config.target_layer_ids, [ex])
    anchors = np.array([12, 14])  # overlapping blocks 12..19 and 14..21
    keep = np.ones(2, dtype=bool)
    blocks = build_blocks(ex.tokens, ex.loss_mask, anchors, keep, 8, MASK, context_len=64)
    mask = np.concatenate([blocks.context_visible, np.ones((2, 8), dtype=bool)], axis=1)
    ids = blocks.block_ids.copy()

    def hidden(block_ids: np.ndarray) -> mx.array:
        f = mx.concatenate([feats[0], mx.zeros((64 - 40, feats[0].shape[1]))])[None]
        inputs = StepInputs(
            f,
            mx.zeros(2, mx.int32),
            mx.array(block_ids),
            mx.array(anchors),
            mx.array(mask[:, None, None, :]),
            mx.array(blocks.labels),
            mx.array(blocks.weights),
        )
        return _block_hidden(drafter, target, inputs)

    base = hidden(ids)
    ids[1, 0] = (ids[1, 0] + 1) % MASK  # change the other block's anchor token
    out = hidden(ids)
    assert mx.allclose(out[0], base[0], atol=1e-6).item()
    assert not mx.allclose(out[1], base[1], atol=1e-3).item()


def test_short_run_reduces_loss_and_serves_losslessly(target: Any, tmp_path: Path) -> None:
    prompts = random_prompts(10, 10)
    examples = distill(target, prompts[:8], (), max_new_tokens=24, progress=False)
    drafter = _drafter(target)
    frozen_embed = np.array(target.inner.embed_tokens.weight)
    result = train_drafter(
        target, drafter, examples, TrainConfig(steps=40, batch_size=4, lr=2e-3), progress=False
    )
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5]) - 0.3
    assert np.array_equal(np.array(target.inner.embed_tokens.weight), frozen_embed)

    save_draft(drafter, tmp_path)
    info = TargetInfo(target.hidden_size, target.num_layers, target.vocab_size, target.family)
    served = load_draft(tmp_path, info)
    for prompt in prompts[8:]:
        ar = generate(target, prompt, 24, ())
        spec = generate(target, prompt, 24, (), served, mode="spec", block_size=8)
        assert spec.output == ar.output
        assert any(c.mode == "spec" for c in spec.cycles)


def test_cached_features_are_what_the_session_sees(target: Any) -> None:
    """Row t of the cached training features is the target state of token t exactly as the
    session gets it (prefill chunk, then one token per forward): no feature shift."""
    drafter = _drafter(target)
    ex = _example(5, length=24)
    ids = drafter.config.target_layer_ids
    cached = target_features(target, ids, [ex])[0]
    cache = target.make_cache()
    parts = [target.forward(mx.array(ex.tokens[None, :10]), cache, ids).features]
    for t in ex.tokens[10:].tolist():
        parts.append(target.forward(mx.array([[t]]), cache, ids).features)
    incremental = mx.concatenate([p for p in parts if p is not None], axis=1)[0]
    assert incremental.shape == cached.shape
    assert mx.allclose(incremental, cached, atol=1e-4).item()


def test_batched_features_equal_one_sequence_at_a_time(target: Any) -> None:
    """Features from right-padded groups equal the one-sequence forwards row for row (padding
    after a sequence cannot reach its rows), in the input order."""
    drafter = _drafter(target)
    ids = drafter.config.target_layer_ids
    examples = [_example(7, length=31), _example(8, length=12), _example(9, length=24)]
    single = target_features(target, ids, examples, batch_tokens=1)
    batched = target_features(target, ids, examples, batch_tokens=3 * 31)
    for one, many, ex in zip(single, batched, examples, strict=True):
        assert one.shape == many.shape == (ex.tokens.size, one.shape[-1])
        assert mx.allclose(one, many, atol=1e-4).item()
