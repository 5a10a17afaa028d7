"""Train a DFlash drafter against a frozen target.

The target runs once per training sequence; the concatenated outputs of its feature layers are
cached. Each step takes `batch_size` sequences, samples fresh anchors in each (so anchors are
re-sampled every epoch), and runs the drafter's own inference code on them:
`drafter.fuse(features)` -> `drafter.context_kv(fused, 0)` for context rows 0..S-1, then
`drafter.denoise` on the blocks. Blocks are laid out one per batch row (keys = [context ; own
block], RoPE offset = anchor per row), with a mask that shows each block the context rows
strictly before its anchor; this is the paper's sparse mask without the always-invisible
other-block columns (`objective.sequence_attention_mask` is the dense form).

Only the drafter's parameters (fc, hidden_norm, layers, norm) train; the target's embedding
and lm_head are borrowed and frozen. AdamW, lr 6e-4, weight decay 0, grad clip 1.0, cosine
schedule with 4% linear warmup, as published.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import structlog
from tqdm import tqdm

from toolflash.engine.drafter import DFlashDrafter
from toolflash.engine.targets.base import TargetAdapter

from .data import TrainingExample
from .objective import (
    acceptance_proxy,
    build_blocks,
    default_anchor_count,
    loss_decay_gamma,
    sample_anchors,
    weighted_cross_entropy,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; `steps` overrides `epochs` when given."""

    steps: int | None = None
    epochs: float = 3.0
    batch_size: int = 8  # sequences per step
    anchors_per_seq: int | None = None  # None: objective.default_anchor_count
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    gamma: float | None = None  # None: the published gamma for the block size
    seed: int = 0
    compile: bool = True
    context_bucket: int = 64  # pad context lengths to a multiple (bounds recompilations)


@dataclass
class TrainResult:
    """What training did: per-step loss and acceptance proxy, and timings."""

    steps: int
    epochs: float
    anchors_per_seq: int
    gamma: float
    feature_s: float
    train_s: float
    losses: list[float] = field(default_factory=list)
    proxy_tau: list[float] = field(default_factory=list)
    proxy_by_position: list[float] = field(default_factory=list)

    def summary(self, points: int = 10) -> dict[str, object]:
        """Loss curve as `points` window means, plus first/last/min."""
        losses = np.array(self.losses)
        windows = np.array_split(losses, min(points, max(1, losses.size))) if losses.size else []
        tail = max(1, len(self.proxy_tau) // 10)
        return {
            "steps": self.steps,
            "epochs": round(self.epochs, 3),
            "anchors_per_seq": self.anchors_per_seq,
            "gamma": self.gamma,
            "loss_first": float(losses[0]) if losses.size else None,
            "loss_last": float(losses[-1]) if losses.size else None,
            "loss_min": float(losses.min()) if losses.size else None,
            "loss_curve": [round(float(w.mean()), 4) for w in windows],
            "proxy_tokens_per_block_last": float(np.mean(self.proxy_tau[-tail:]))
            if self.proxy_tau
            else None,
            "proxy_by_position_last": [round(x, 4) for x in self.proxy_by_position],
            "feature_s": round(self.feature_s, 2),
            "train_s": round(self.train_s, 2),
        }


def default_feature_batch_tokens() -> int:
    """Padded tokens per feature forward. On a GPU one forward per sequence leaves the device
    idle (60k sequences of the tiny qwen3 took 144 s one by one, 14 s batched on an H200); on
    a CPU a single sequence is already matrix-shaped, and batching would only add padding."""
    return 1 if mx.default_device() == mx.cpu else 32768


def target_features(
    target: TargetAdapter,
    layer_ids: Sequence[int],
    examples: Sequence[TrainingExample],
    progress: bool = False,
    batch_tokens: int | None = None,
) -> list[mx.array]:
    """Concatenated outputs of `layer_ids` for every position of every example ([S, n*H]),
    from frozen target forwards. Row t belongs to token t (no shift).

    Sequences of similar length run together, right-padded to the longest of their group,
    at most `batch_tokens` padded tokens per forward (default `default_feature_batch_tokens`).
    Right padding cannot change a real row: attention is causal and the recurrent layers scan
    forward, so a row only sees the tokens before it."""
    budget = batch_tokens if batch_tokens is not None else default_feature_batch_tokens()
    order = sorted(range(len(examples)), key=lambda i: int(examples[i].tokens.size))
    out: list[mx.array | None] = [None] * len(examples)
    bar = tqdm(total=len(examples), desc="features", unit="seq", disable=not progress)
    start = 0
    while start < len(order):
        # Sorted ascending, so the group's last sequence is its longest.
        stop = start + 1
        while (
            stop < len(order)
            and (stop + 1 - start) * int(examples[order[stop]].tokens.size) <= budget
        ):
            stop += 1
        group = order[start:stop]
        width = int(examples[group[-1]].tokens.size)
        tokens = np.zeros((len(group), width), dtype=np.int32)
        for row, i in enumerate(group):
            tokens[row, : examples[i].tokens.size] = examples[i].tokens
        res = target.forward(mx.array(tokens), target.make_cache(), capture=layer_ids)
        assert res.features is not None
        feats = mx.stop_gradient(res.features).astype(mx.float32)
        rows = [feats[row, : examples[i].tokens.size] for row, i in enumerate(group)]
        mx.eval(rows)
        for row, i in enumerate(group):
            out[i] = rows[row]
        bar.update(len(group))
        start = stop
    bar.close()
    return [f for f in out if f is not None]


@dataclass(frozen=True)
class StepInputs:
    """One step's arrays: B sequences' features and their B*N blocks (one block per row)."""

    features: mx.array  # [B, S, n*H]
    seq_index: mx.array  # [B*N] which sequence each block reads its context from
    block_ids: mx.array  # [B*N, bs]
    anchors: mx.array  # [B*N] RoPE offset of each block (its anchor position)
    mask: mx.array  # [B*N, 1, 1, S+bs] bool: context rows < anchor, then the own block
    labels: mx.array  # [B*N, bs]
    weights: mx.array  # [B*N, bs]

    def arrays(self) -> tuple[mx.array, ...]:
        return (
            self.features,
            self.seq_index,
            self.block_ids,
            self.anchors,
            self.mask,
            self.labels,
            self.weights,
        )


def draft_loss(
    drafter: DFlashDrafter,
    target: TargetAdapter,
    features: mx.array,
    seq_index: mx.array,
    block_ids: mx.array,
    anchors: mx.array,
    mask: mx.array,
    labels: mx.array,
    weights: mx.array,
) -> tuple[mx.array, mx.array]:
    """Weighted CE of the drafter's block predictions at positions 1..bs-1, and its argmax."""
    fused = drafter.fuse(features)
    ctx = [(k[seq_index], v[seq_index]) for k, v in drafter.context_kv(fused, 0)]
    hidden = drafter.denoise(target.embed(block_ids), anchors, ctx, mask)
    logits = target.lm_head(hidden[:, 1:])
    loss = weighted_cross_entropy(logits, labels[:, 1:], weights[:, 1:])
    return loss, mx.argmax(logits, axis=-1)


def collate(
    examples: Sequence[TrainingExample],
    features: Sequence[mx.array],
    anchors_per_seq: int,
    block_size: int,
    mask_token_id: int,
    gamma: float,
    rng: np.random.Generator,
    context_bucket: int = 64,
) -> StepInputs:
    """Sample anchors in each sequence and lay the blocks out one per row."""
    longest = max(ex.tokens.size for ex in examples)
    s = int(math.ceil(longest / context_bucket) * context_bucket)
    n_feat = int(features[0].shape[-1])
    feats = []
    block_ids, anchors, labels, weights, visible, seq_index = [], [], [], [], [], []
    for i, (ex, f) in enumerate(zip(examples, features, strict=True)):
        a, keep = sample_anchors(ex.loss_mask, anchors_per_seq, rng)
        blocks = build_blocks(
            ex.tokens, ex.loss_mask, a, keep, block_size, mask_token_id, gamma, context_len=s
        )
        pad = s - int(f.shape[0])
        feats.append(mx.concatenate([f, mx.zeros((pad, n_feat), f.dtype)]) if pad else f)
        block_ids.append(blocks.block_ids)
        anchors.append(blocks.anchors)
        labels.append(blocks.labels)
        weights.append(blocks.weights)
        visible.append(blocks.context_visible)
        seq_index.append(np.full(anchors_per_seq, i))
    ctx_visible = np.concatenate(visible)
    own_block = np.ones((ctx_visible.shape[0], block_size), dtype=bool)
    mask = np.concatenate([ctx_visible, own_block], axis=1)[:, None, None, :]
    return StepInputs(
        features=mx.stack(feats),
        seq_index=mx.array(np.concatenate(seq_index).astype(np.int32)),
        block_ids=mx.array(np.concatenate(block_ids).astype(np.int32)),
        anchors=mx.array(np.concatenate(anchors).astype(np.int32)),
        mask=mx.array(mask),
        labels=mx.array(np.concatenate(labels).astype(np.int32)),
        weights=mx.array(np.concatenate(weights)),
    )


_LOG_EVERY = 50  # steps between progress lines when there is no progress bar


def _batches(n: int, batch_size: int, steps: int, rng: np.random.Generator) -> Iterator[list[int]]:
    """Index batches from consecutive shuffled passes over the data (a short last batch is
    completed from the next pass, so every step has the same shape)."""
    stream: list[int] = []
    for _ in range(steps):
        while len(stream) < batch_size:
            stream.extend(int(i) for i in rng.permutation(n))
        yield stream[:batch_size]
        stream = stream[batch_size:]


def _schedule(cfg: TrainConfig, steps: int) -> Callable[[mx.array], mx.array]:
    warmup = max(1, round(cfg.warmup_ratio * steps))
    return optim.join_schedules(
        [
            optim.linear_schedule(0.0, cfg.lr, warmup),
            optim.cosine_decay(cfg.lr, max(1, steps - warmup)),
        ],
        [warmup],
    )


def train_drafter(
    target: TargetAdapter,
    drafter: DFlashDrafter,
    examples: Sequence[TrainingExample],
    cfg: TrainConfig,
    progress: bool = True,
    features: Sequence[mx.array] | None = None,
) -> TrainResult:
    """Train `drafter` in place on `examples` (the target stays frozen)."""
    if not examples:
        raise ValueError("no training examples")
    dcfg = drafter.config
    bs = dcfg.block_size
    gamma = cfg.gamma if cfg.gamma is not None else loss_decay_gamma(bs)
    n_anchors = cfg.anchors_per_seq or default_anchor_count(
        [ex.response_len for ex in examples], bs
    )
    batch_size = min(cfg.batch_size, len(examples))
    steps = cfg.steps or max(1, math.ceil(cfg.epochs * len(examples) / batch_size))

    t0 = time.perf_counter()
    if features is None:
        features = target_features(target, dcfg.target_layer_ids, examples, progress)
    feature_s = time.perf_counter() - t0

    mx.random.seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    drafter.train()
    optimizer = optim.AdamW(learning_rate=_schedule(cfg, steps), weight_decay=cfg.weight_decay)
    loss_and_grad = nn.value_and_grad(drafter, partial(draft_loss, drafter, target))

    def step(*inputs: mx.array) -> tuple[mx.array, mx.array]:
        (loss, preds), grads = loss_and_grad(*inputs)
        grads, _ = optim.clip_grad_norm(grads, cfg.grad_clip)
        optimizer.update(drafter, grads)
        return loss, preds

    state = [drafter.state, optimizer.state]
    run_step = mx.compile(step, inputs=state, outputs=state) if cfg.compile else step

    result = TrainResult(steps, 0.0, n_anchors, gamma, feature_s, 0.0)
    t1 = time.perf_counter()
    bar = tqdm(
        _batches(len(examples), batch_size, steps, rng),
        total=steps,
        desc="train-draft",
        unit="step",
        disable=not progress,
    )
    for idx in bar:
        inputs = collate(
            [examples[i] for i in idx],
            [features[i] for i in idx],
            n_anchors,
            bs,
            dcfg.mask_token_id,
            gamma,
            rng,
            cfg.context_bucket,
        )
        loss, preds = run_step(*inputs.arrays())
        mx.eval(loss, preds, state)
        proxy = acceptance_proxy(preds, inputs.labels[:, 1:], inputs.weights[:, 1:])
        result.losses.append(float(np.array(loss)))
        result.proxy_tau.append(proxy.tokens_per_block)
        result.proxy_by_position = proxy.by_position
        bar.set_postfix(loss=f"{result.losses[-1]:.3f}", proxy_tau=f"{proxy.tokens_per_block:.2f}")
        done = len(result.losses)
        if not progress and (done % _LOG_EVERY == 0 or done == steps):
            # No bar (a worker process, a log file): say how far training got.
            recent = result.losses[-_LOG_EVERY:]
            log.info(
                "draft_train.step",
                step=done,
                steps=steps,
                loss=round(sum(recent) / len(recent), 4),
                proxy_tau=round(proxy.tokens_per_block, 3),
                elapsed_s=round(time.perf_counter() - t1, 1),
            )
    result.train_s = time.perf_counter() - t1
    result.epochs = steps * batch_size / len(examples)
    drafter.eval()
    log.info(
        "draft_trained",
        steps=steps,
        loss_first=result.losses[0],
        loss_last=result.losses[-1],
        seconds=round(result.train_s, 1),
    )
    return result
