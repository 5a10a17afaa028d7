"""The DFlash objective's pure pieces: anchors, mask, labels, decay, loss, proxy."""

from __future__ import annotations

import math
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from toolflash.training.objective import (
    ObjectiveError,
    acceptance_proxy,
    build_blocks,
    check_blocks,
    decay_weights,
    default_anchor_count,
    loss_decay_gamma,
    sample_anchors,
    sequence_attention_mask,
    valid_anchors,
    weighted_cross_entropy,
)

MASK = 255
BS = 8


def _sequence(seed: int = 0, length: int = 40, prompt: int = 10) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 200, size=length)
    loss_mask = np.arange(length) >= prompt
    return tokens, loss_mask


def _blocks(anchors: list[int], length: int = 40, prompt: int = 10, context_len: int = 64):
    tokens, loss_mask = _sequence(length=length, prompt=prompt)
    a = np.array(anchors)
    keep = np.ones(len(anchors), dtype=bool)
    batch = build_blocks(tokens, loss_mask, a, keep, BS, MASK, context_len=context_len)
    return tokens, loss_mask, batch


def test_published_gammas_and_interpolation() -> None:
    assert loss_decay_gamma(16) == 7.0
    assert loss_decay_gamma(10) == 5.0
    assert loss_decay_gamma(8) == 4.0
    assert 5.0 < loss_decay_gamma(12) < 7.0
    assert loss_decay_gamma(4) == 4.0 and loss_decay_gamma(32) == 7.0


@pytest.mark.parametrize("bs", [8, 10, 16])
def test_decay_weights(bs: int) -> None:
    w = decay_weights(bs)
    gamma = loss_decay_gamma(bs)
    assert w[0] == 0.0  # position 0 is the given anchor token
    assert w[1] == pytest.approx(1.0)
    for k in range(1, bs):
        assert w[k] == pytest.approx(math.exp(-(k - 1) / gamma), rel=1e-6)
    assert np.all(np.diff(w[1:]) < 0)


def test_valid_anchors_need_a_supervised_successor() -> None:
    mask = np.array([0, 0, 1, 1, 1, 0, 1, 1], dtype=bool)
    assert valid_anchors(mask).tolist() == [2, 3, 6]


def test_sample_anchors_distinct_sorted_valid_and_resampled() -> None:
    _, loss_mask = _sequence()
    rng = np.random.default_rng(0)
    a1, keep1 = sample_anchors(loss_mask, 12, rng)
    a2, _ = sample_anchors(loss_mask, 12, rng)
    assert keep1.all()
    assert len(set(a1.tolist())) == 12 and np.all(np.diff(a1) > 0)
    assert set(a1.tolist()) <= set(valid_anchors(loss_mask).tolist())
    assert a1.tolist() != a2.tolist()  # fresh anchors at every visit (every epoch)


def test_sample_anchors_pads_when_few_are_valid() -> None:
    loss_mask = np.array([0, 0, 0, 1, 1, 1], dtype=bool)
    anchors, keep = sample_anchors(loss_mask, 5, np.random.default_rng(0))
    assert keep.tolist() == [True, True, False, False, False]
    assert anchors[:2].tolist() == [3, 4]


def test_blocks_inputs_labels_and_weights() -> None:
    tokens, loss_mask, batch = _blocks([10, 20, 36])
    check_blocks(tokens, loss_mask, batch, MASK)
    for b, a in enumerate([10, 20, 36]):
        assert batch.block_ids[b, 0] == tokens[a]
        assert (batch.block_ids[b, 1:] == MASK).all()
        for k in range(1, BS):
            if a + k < tokens.size:
                assert batch.labels[b, k] == tokens[a + k]  # same-position label
    # Block at 36 of a 40-token sequence: only k = 1..3 are supervised.
    assert (batch.weights[2, 1:4] > 0).all() and (batch.weights[2, 4:] == 0).all()
    assert (batch.weights[:, 0] == 0).all()


def test_labels_beyond_the_response_are_not_supervised() -> None:
    tokens, _ = _sequence()
    loss_mask = np.zeros(tokens.size, dtype=bool)
    loss_mask[10:15] = True  # a response followed by an unsupervised tail
    batch = build_blocks(tokens, loss_mask, np.array([12]), np.array([True]), BS, MASK)
    assert (batch.weights[0, 1:3] > 0).all() and (batch.weights[0, 3:] == 0).all()
    check_blocks(tokens, loss_mask, batch, MASK)


def test_context_is_strictly_before_the_anchor() -> None:
    _, _, batch = _blocks([10, 11, 25])
    for b, a in enumerate([10, 11, 25]):
        assert np.flatnonzero(batch.context_visible[b]).tolist() == list(range(a))
        assert not batch.context_visible[b, a]  # the anchor's own target state is unseen


def test_dense_mask_no_cross_block_visibility_with_overlapping_anchors() -> None:
    # Anchors 12 and 14 overlap: block 0 covers positions 12..19, block 1 14..21.
    _, _, batch = _blocks([12, 14], context_len=40)
    dense = sequence_attention_mask(batch)
    s = 40
    assert dense.shape == (2 * BS, s + 2 * BS)
    blocks = dense[:, s:]
    own0 = blocks[:BS, :BS]
    own1 = blocks[BS:, BS:]
    assert own0.all() and own1.all()  # bidirectional inside a block (incl. later positions)
    assert not blocks[:BS, BS:].any() and not blocks[BS:, :BS].any()  # nothing across blocks
    assert np.flatnonzero(dense[0, :s]).tolist() == list(range(12))
    assert np.flatnonzero(dense[BS, :s]).tolist() == list(range(14))


def test_dense_mask_equals_the_compact_layout() -> None:
    """The trainer runs each block as its own row with keys [context ; own block]; the dense
    paper layout restricted to a block's own columns is exactly that."""
    _, _, batch = _blocks([10, 13, 13 + BS, 30], context_len=48)
    dense = sequence_attention_mask(batch)
    s = 48
    for b in range(4):
        rows = dense[b * BS : (b + 1) * BS]
        compact = np.concatenate([batch.context_visible[b], np.ones(BS, dtype=bool)])
        own = np.concatenate([rows[:, :s], rows[:, s + b * BS : s + (b + 1) * BS]], axis=1)
        assert (own == compact[None, :]).all()
        others = np.delete(rows[:, s:], np.s_[b * BS : (b + 1) * BS], axis=1)
        assert not others.any()


def test_padding_blocks_see_no_context_and_carry_no_loss() -> None:
    tokens, loss_mask = _sequence()
    batch = build_blocks(
        tokens, loss_mask, np.array([15, 0]), np.array([True, False]), BS, MASK, context_len=64
    )
    assert not batch.context_visible[1].any() and not batch.weights[1].any()
    check_blocks(tokens, loss_mask, batch, MASK)
    assert not sequence_attention_mask(batch)[BS:].any()


# --- pitfalls of section 3.7: each corrupted batch is caught ---------------------------------


def test_shifted_labels_are_detected() -> None:
    tokens, loss_mask, batch = _blocks([10, 20])
    # EAGLE-style next-token labels: position k labelled with tokens[anchor + k + 1].
    shifted = np.zeros_like(batch.labels)
    for b, a in enumerate([10, 20]):
        shifted[b, :] = tokens[a + 1 : a + 1 + BS]
    with pytest.raises(ObjectiveError, match="shifted labels"):
        check_blocks(tokens, loss_mask, replace(batch, labels=shifted), MASK)


def test_off_by_one_label_offsets_are_detected() -> None:
    tokens, loss_mask, batch = _blocks([12])
    # SpecForge #473's arange(1, bs + 1) offsets with position 0 dropped.
    labels = batch.labels.copy()
    labels[0, 1:] = tokens[12 + 2 : 12 + BS + 1]
    with pytest.raises(ObjectiveError):
        check_blocks(tokens, loss_mask, replace(batch, labels=labels), MASK)


def test_anchor_inclusive_context_is_detected() -> None:
    tokens, loss_mask, batch = _blocks([10, 20])
    inclusive = np.arange(64)[None, :] <= batch.anchors[:, None]
    with pytest.raises(ObjectiveError, match="strictly before"):
        check_blocks(tokens, loss_mask, replace(batch, context_visible=inclusive), MASK)


def test_loss_on_position_zero_is_detected() -> None:
    tokens, loss_mask, batch = _blocks([10])
    weights = batch.weights.copy()
    weights[0, 0] = 1.0
    with pytest.raises(ObjectiveError, match="position 0"):
        check_blocks(tokens, loss_mask, replace(batch, weights=weights), MASK)


def test_anchor_outside_the_response_is_detected() -> None:
    tokens, loss_mask, batch = _blocks([5])  # a prompt position
    with pytest.raises(ObjectiveError, match="not a supervised position"):
        check_blocks(tokens, loss_mask, batch, MASK)


# --- loss and proxy ---------------------------------------------------------------------------


def test_weighted_cross_entropy_is_normalised_by_the_weight_sum() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 10)).astype(np.float32)
    labels = rng.integers(0, 10, size=(3, 4))
    weights = rng.uniform(size=(3, 4)).astype(np.float32)
    weights[1] = 0.0
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    expected = (ce * weights).sum() / weights.sum()
    got = weighted_cross_entropy(mx.array(logits), mx.array(labels), mx.array(weights))
    assert got.item() == pytest.approx(float(expected), rel=1e-5)
    zero = weighted_cross_entropy(mx.array(logits), mx.array(labels), mx.zeros((3, 4)))
    assert zero.item() == 0.0


def test_acceptance_proxy_is_a_cumulative_prefix() -> None:
    labels = mx.array([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    preds = mx.array([[1, 2, 9, 4], [9, 2, 3, 4], [1, 2, 3, 4]])
    weights = mx.array([[1.0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    proxy = acceptance_proxy(preds, labels, weights)
    # accepted prefixes: 2 (stops at the miss, later hit ignored), 0, 2 (unsupervised tail)
    assert proxy.blocks == 3
    assert proxy.tokens_per_block == pytest.approx(1 + 4 / 3)
    assert proxy.by_position == pytest.approx([2 / 3, 2 / 3, 0.0, 0.0])


def test_default_anchor_count() -> None:
    assert default_anchor_count([128, 128], 8) == 32  # N * bs = 2x the response
    assert default_anchor_count([4], 8) == 4
    assert default_anchor_count([4000], 16) == 64
