"""The DFlash training objective as published, as pure functions (paper section 3.3-3.5).

One training sequence = prompt + response tokens, `loss_mask` true on the response. Per step:

- anchors: positions t with loss_mask[t] and loss_mask[t+1] (a response token followed by at
  least one supervised token), sampled without replacement, re-sampled every time the sequence
  is visited (so every epoch);
- block b: `[tokens[a_b], MASK * (bs-1)]` at positions `a_b .. a_b+bs-1`;
- attention: the queries of block b see context rows p < a_b (strictly: at inference the target
  has not processed the anchor token yet), every token of block b (bidirectional), and nothing
  of any other block, even when anchors overlap;
- labels: block position k is supervised with tokens[a_b + k] (same-position prediction,
  position 0 is the given token and carries no loss);
- loss: cross-entropy weighted by exp(-(k-1)/gamma) and the label's loss mask, normalised by
  the weight sum.

Host-side pieces use numpy (they are index bookkeeping); the loss and the acceptance proxy
take MLX arrays. `check_blocks` re-derives every invariant from the raw tokens, so a shifted
label or an anchor-inclusive context fails loudly instead of silently ruining acceptance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from toolflash.kernels.training_math import training_math

# Published decay constants (paper A.1): block size -> gamma.
PUBLISHED_GAMMA: dict[int, float] = {8: 4.0, 10: 5.0, 16: 7.0}


class ObjectiveError(ValueError):
    """A block batch that violates the DFlash training invariants."""


def loss_decay_gamma(block_size: int) -> float:
    """Gamma of the loss decay: the published value for block 8/10/16, else linearly
    interpolated between (clamped to) the published points."""
    if block_size in PUBLISHED_GAMMA:
        return PUBLISHED_GAMMA[block_size]
    sizes = sorted(PUBLISHED_GAMMA)
    gammas = [PUBLISHED_GAMMA[s] for s in sizes]
    return float(np.interp(block_size, sizes, gammas))


def decay_weights(block_size: int, gamma: float | None = None) -> np.ndarray:
    """Per-position loss weights [bs]: 0 at position 0, exp(-(k-1)/gamma) for k >= 1."""
    g = loss_decay_gamma(block_size) if gamma is None else gamma
    k = np.arange(block_size, dtype=np.float64)
    w = np.exp(-(k - 1.0) / g)
    w[0] = 0.0
    return w.astype(np.float32)


def valid_anchors(loss_mask: np.ndarray) -> np.ndarray:
    """Positions t with loss_mask[t] and loss_mask[t+1] both true."""
    m = np.asarray(loss_mask, dtype=bool)
    if m.size < 2:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(m[:-1] & m[1:])


def sample_anchors(
    loss_mask: np.ndarray, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Sample min(n, #valid) distinct valid anchors, sorted; pad to n slots.

    Returns (anchors [n] int64, keep [n] bool); padded slots have anchor 0 and keep False."""
    candidates = valid_anchors(loss_mask)
    take = min(n, candidates.size)
    anchors = np.zeros(n, dtype=np.int64)
    keep = np.zeros(n, dtype=bool)
    if take:
        anchors[:take] = np.sort(rng.choice(candidates, size=take, replace=False))
        keep[:take] = True
    return anchors, keep


@dataclass(frozen=True)
class BlockBatch:
    """The blocks of one sequence (N blocks of bs positions, compact layout).

    `context_visible[b, p]` says whether block b's queries see context row p (p < seq_len
    padded to `context_visible.shape[1]`); every block sees all of its own positions and
    nothing of the other blocks, which the compact layout (each block its own batch row, keys
    = [context ; own block]) guarantees by construction."""

    block_ids: np.ndarray  # [N, bs] int: anchor token, then mask ids
    anchors: np.ndarray  # [N] int: absolute position of block position 0
    keep: np.ndarray  # [N] bool: real (not padding) blocks
    labels: np.ndarray  # [N, bs] int: tokens[anchor + k] (0 past the end)
    weights: np.ndarray  # [N, bs] float32: decay * label supervised * keep; 0 at k = 0
    context_visible: np.ndarray  # [N, S] bool

    @property
    def block_size(self) -> int:
        return int(self.block_ids.shape[1])


def build_blocks(
    tokens: np.ndarray,
    loss_mask: np.ndarray,
    anchors: np.ndarray,
    keep: np.ndarray,
    block_size: int,
    mask_token_id: int,
    gamma: float | None = None,
    context_len: int | None = None,
) -> BlockBatch:
    """Block inputs, same-position labels, loss weights and context visibility for `anchors`
    of one sequence. `context_len` pads the visibility to a batch-wide context length."""
    tokens = np.asarray(tokens, dtype=np.int64)
    loss_mask = np.asarray(loss_mask, dtype=bool)
    seq_len = tokens.size
    n = anchors.size
    k = np.arange(block_size)
    pos = anchors[:, None] + k[None, :]  # [N, bs] absolute position of each block slot
    inside = pos < seq_len
    safe = np.where(inside, pos, 0)

    block_ids = np.full((n, block_size), mask_token_id, dtype=np.int64)
    block_ids[:, 0] = tokens[anchors]
    labels = np.where(inside, tokens[safe], 0)
    supervised = inside & loss_mask[safe] & keep[:, None]
    weights = np.where(supervised, decay_weights(block_size, gamma)[None, :], 0.0)
    weights = weights.astype(np.float32)

    s = seq_len if context_len is None else context_len
    if s < seq_len:
        raise ObjectiveError(f"context_len {s} is shorter than the sequence ({seq_len})")
    # Strictly before the anchor: row `anchor` is the anchor token's own target state, which
    # at inference does not exist yet when the block is drafted.
    context_visible = np.arange(s)[None, :] < anchors[:, None]
    context_visible &= keep[:, None]
    return BlockBatch(block_ids, anchors.astype(np.int64), keep, labels, weights, context_visible)


def sequence_attention_mask(batch: BlockBatch) -> np.ndarray:
    """The paper's dense layout (Fig. 4): all N blocks of a sequence as one query sequence of
    N*bs rows against keys [context (S rows) ; all blocks (N*bs rows)]. Returns [N*bs, S+N*bs]
    bool. The trainer uses the equivalent compact layout (`BlockBatch.context_visible`, one
    block per batch row); this form documents and tests that equivalence."""
    n, bs = batch.block_ids.shape
    ctx = np.repeat(batch.context_visible, bs, axis=0)  # [N*bs, S]
    block_of = np.repeat(np.arange(n), bs)
    # Visibility between block tokens is decided by block identity, never by absolute
    # position: overlapping anchors put two blocks on the same positions.
    same_block = block_of[:, None] == block_of[None, :]
    real = np.repeat(batch.keep, bs)
    return np.concatenate([ctx, same_block & real[:, None] & real[None, :]], axis=1)


def check_blocks(
    tokens: np.ndarray, loss_mask: np.ndarray, batch: BlockBatch, mask_token_id: int
) -> None:
    """Re-derive every invariant of `batch` from the raw sequence; raise ObjectiveError on the
    first violation (label shift, anchor-inclusive or leaky context, bad block inputs)."""
    tokens = np.asarray(tokens)
    loss_mask = np.asarray(loss_mask, dtype=bool)
    seq_len = tokens.size
    n, bs = batch.block_ids.shape
    for b in range(n):
        if not batch.keep[b]:
            if batch.weights[b].any() or batch.context_visible[b].any():
                raise ObjectiveError(f"padding block {b} carries loss or sees context")
            continue
        a = int(batch.anchors[b])
        if not (loss_mask[a] and a + 1 < seq_len and loss_mask[a + 1]):
            raise ObjectiveError(f"block {b}: anchor {a} is not a supervised position")
        if batch.block_ids[b, 0] != tokens[a]:
            raise ObjectiveError(f"block {b}: position 0 is not the anchor token")
        if (batch.block_ids[b, 1:] != mask_token_id).any():
            raise ObjectiveError(f"block {b}: positions 1.. are not mask tokens")
        visible = np.flatnonzero(batch.context_visible[b])
        if visible.size != a or (visible.size and visible[-1] != a - 1):
            raise ObjectiveError(
                f"block {b}: context must be exactly rows 0..{a - 1} (strictly before anchor "
                f"{a}); sees {visible.size} rows up to {visible[-1] if visible.size else None}"
            )
        if batch.weights[b, 0] != 0:
            raise ObjectiveError(f"block {b}: position 0 (the given token) carries loss")
        for k in range(1, bs):
            p = a + k
            supervised = p < seq_len and bool(loss_mask[p])
            if supervised != (batch.weights[b, k] > 0):
                raise ObjectiveError(f"block {b}: weight at k={k} disagrees with the loss mask")
            if supervised and batch.labels[b, k] != tokens[p]:
                raise ObjectiveError(
                    f"block {b}: label at k={k} is not tokens[anchor + {k}] (shifted labels)"
                )


def weighted_cross_entropy(logits: mx.array, labels: mx.array, weights: mx.array) -> mx.array:
    """Sum of per-position CE times weight, divided by the weight sum (0 if no weight).
    On the CPU the cross entropy goes through the fast exponential (`training_math`)."""
    ce = training_math().cross_entropy(logits, labels)
    total = weights.sum()
    return (ce * weights).sum() / mx.maximum(total, 1e-6)


@dataclass(frozen=True)
class AcceptanceProxy:
    """Training-side acceptance: per block, the longest prefix of positions 1.. whose argmax
    equals the label. Not the real acceptance (that needs the real loop)."""

    tokens_per_block: float  # 1 + mean accepted prefix (counts the bonus like tau)
    by_position: list[float]  # share of blocks accepted through position k (k = 1..bs-1)
    blocks: int


def acceptance_proxy(predictions: mx.array, labels: mx.array, weights: mx.array) -> AcceptanceProxy:
    """predictions/labels/weights [N, bs-1] for block positions 1..bs-1 (weights 0 where not
    supervised); blocks whose first label is unsupervised are ignored."""
    hit = (predictions == labels) & (weights > 0)
    run = mx.cumprod(hit.astype(mx.int32), axis=1)
    live = weights[:, 0] > 0
    live_f = live.astype(mx.float32)
    n = live_f.sum()
    accepted = (run.sum(axis=1).astype(mx.float32) * live_f).sum()
    by_pos = (run.astype(mx.float32) * live_f[:, None]).sum(axis=0)
    mx.eval(n, accepted, by_pos)
    blocks = round(float(np.array(n)))
    if blocks == 0:
        return AcceptanceProxy(1.0, [0.0] * int(labels.shape[1]), 0)
    return AcceptanceProxy(
        tokens_per_block=1.0 + float(np.array(accepted)) / blocks,
        by_position=[float(x) / blocks for x in np.array(by_pos)],
        blocks=blocks,
    )


def default_anchor_count(response_lengths: list[int], block_size: int) -> int:
    """Anchors per sequence so that N*bs is about twice the median response (paper/ModelOpt:
    N*bs ~ 1-2x the supervised length), between 4 and 64."""
    if not response_lengths:
        return 4
    median = float(np.median(response_lengths))
    return int(min(64, max(4, math.ceil(2 * median / block_size))))
