"""Train a tiny target (mlx-lm `qwen3` or `qwen3_5`) on the zoo corpus and save it mlx-lm style.

The output directory holds `config.json`, `model.safetensors` (bfloat16; the engine upcasts),
the tokenizer files and `training.json`, so `mlx_lm.load(out_dir)` loads it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import structlog
from mlx.utils import tree_flatten

from toolflash.engine.targets.base import training_logits
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target
from toolflash.kernels.training_math import training_math
from toolflash.zoo.corpus import corpus_digest, render_training_text
from toolflash.zoo.recipes import CPU
from toolflash.zoo.records import Record
from toolflash.zoo.target_configs import Family, build_model, target_config
from toolflash.zoo.tokenizer import EOS_TOKEN, copy_tokenizer_files

log = structlog.get_logger(__name__)

SAVE_DTYPE = mx.bfloat16
_KEEP_FP32 = ("A_log",)  # GatedDeltaNet decay: mlx-lm never casts it either


@dataclass(frozen=True)
class TrainResult:
    """What a training run produced and how fast it ran."""

    family: str
    out_dir: str
    params: int
    steps: int
    batch_size: int
    seq_len: int
    tokens_seen: int
    corpus_tokens: int
    first_loss: float
    final_loss: float
    wall_s: float
    tokens_per_s: float
    seed: int
    corpus_digest: str


def tokenize_corpus(records: Sequence[Record], tokenizer_dir: Path) -> tuple[np.ndarray, str]:
    """Render every record and encode it; returns the packed int32 token stream and its digest."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    texts = [render_training_text(r, hf) for r in records]
    fast = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    encoded = fast.encode_batch(texts, add_special_tokens=False)
    stream = np.fromiter((t for e in encoded for t in e.ids), dtype=np.int32)
    return stream, corpus_digest(texts)


def pack_windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut the stream into [N, seq_len + 1] windows (inputs and shifted labels), stride seq_len."""
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise ValueError(f"corpus has {len(stream)} tokens, fewer than one window of {seq_len}")
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return stream[idx]


def _schedule(lr: float, steps: int) -> Callable[[mx.array], mx.array]:
    warmup = max(1, int(0.04 * steps))
    return optim.join_schedules(
        [
            optim.linear_schedule(lr * 0.05, lr, warmup),
            optim.cosine_decay(lr, steps - warmup, lr * 0.1),
        ],
        [warmup],
    )


def flat_parameters(model: nn.Module) -> dict[str, mx.array]:
    """The model's parameters by their mlx-lm (safetensors) names."""
    return cast(dict[str, mx.array], dict(tree_flatten(model.parameters())))


def save_target(
    model: nn.Module, config: dict[str, Any], tokenizer_dir: Path, out_dir: Path
) -> None:
    """Write config.json, model.safetensors (bfloat16 except GDN decays) and the tokenizer files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {
        k: v if any(k.endswith(s) for s in _KEEP_FP32) else v.astype(SAVE_DTYPE)
        for k, v in flat_parameters(model).items()
    }
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    copy_tokenizer_files(tokenizer_dir, out_dir)


def train_target(
    family: Family,
    corpus: Sequence[Record],
    tokenizer_dir: Path,
    out_dir: Path,
    steps: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    seq_len: int | None = None,
    lr: float | None = None,
    log_every: int = 10,
    stream: np.ndarray | None = None,
    stream_digest: str = "",
    config_overrides: dict[str, Any] | None = None,
) -> TrainResult:
    """Train a tiny `family` target on `corpus` and save it under `out_dir`.

    AdamW (wd 0.1, betas 0.9/0.95), 4% warmup then cosine to 10%, grad clip 1.0, compiled step,
    loss on every token of the packed rendered samples. Data order and init follow `seed`.
    Pass `stream` and `stream_digest` (from `tokenize_corpus`) to reuse one tokenization;
    `config_overrides` shrink or reshape the architecture (tests use it). Settings left out
    are the `cpu` recipe's.
    """
    defaults = CPU.targets[family]
    steps = steps or defaults.steps
    batch_size = batch_size or defaults.batch_size
    seq_len = seq_len or defaults.seq_len
    lr = lr or defaults.lr

    digest = stream_digest
    if stream is None:
        stream, digest = tokenize_corpus(corpus, tokenizer_dir)
    windows = pack_windows(stream, seq_len)
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    added = {a["content"]: a["id"] for a in spec["added_tokens"]}
    config = target_config(
        family, len(spec["model"]["vocab"]), added[EOS_TOKEN], overrides=config_overrides
    )

    mx.random.seed(seed)
    data_rng = np.random.default_rng(seed)
    model = build_model(config)
    model.train()
    params = sum(v.size for v in flat_parameters(model).values())
    opt = optim.AdamW(learning_rate=_schedule(lr, steps), betas=[0.9, 0.95], weight_decay=0.1)

    # The forward walks mlx-lm's layers through toolflash's adapter: the hybrid's recurrence
    # in chunked form (2.3x faster per step on the CPU than mlx-lm's loop over positions), and
    # on the CPU the softmax, SiLU and cross entropy through the fast exponential (1.4x). The
    # saved weights are mlx-lm's.
    adapter_cls = Qwen35Target if family == "qwen3_5" else Qwen3Target
    ops = training_math()

    def loss_fn(m: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        logits = training_logits(adapter_cls(m), x, ops).astype(mx.float32)
        return ops.cross_entropy(logits, y).mean()

    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x: mx.array, y: mx.array) -> mx.array:
        loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        return loss

    log.info(
        "target.train.start",
        family=family,
        params=params,
        corpus_tokens=int(len(stream)),
        windows=len(windows),
        steps=steps,
        batch=batch_size,
        seq_len=seq_len,
        math=ops.name,
        epochs=round(steps * batch_size / len(windows), 2),
    )
    order = data_rng.permutation(len(windows))
    cursor = 0
    losses: list[float] = []
    start = time.perf_counter()
    window_start, window_losses = start, []
    for i in range(steps):
        if cursor + batch_size > len(order):
            order, cursor = data_rng.permutation(len(windows)), 0
        batch = mx.array(windows[order[cursor : cursor + batch_size]])
        cursor += batch_size
        loss = step_fn(batch[:, :-1], batch[:, 1:])
        mx.eval(loss, state)
        losses.append(float(loss.item()))  # type: ignore[arg-type]
        window_losses.append(losses[-1])
        if (i + 1) % log_every == 0 or i + 1 == steps:
            now = time.perf_counter()
            log.info(
                "target.train.step",
                family=family,
                step=i + 1,
                loss=round(sum(window_losses) / len(window_losses), 4),
                lr=f"{opt.learning_rate.item():.2e}",
                tok_s=round(len(window_losses) * batch_size * seq_len / (now - window_start)),
                elapsed_s=round(now - start, 1),
            )
            window_start, window_losses = now, []
    wall = time.perf_counter() - start
    if not all(math.isfinite(v) for v in losses):
        raise RuntimeError(f"{family} training diverged (non-finite loss)")

    model.eval()
    save_target(model, config, tokenizer_dir, out_dir)
    head = losses[: max(1, min(5, len(losses) // 4))]
    tail = losses[-max(1, min(10, len(losses) // 4)) :]
    result = TrainResult(
        family=family,
        out_dir=str(out_dir),
        params=params,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        tokens_seen=steps * batch_size * seq_len,
        corpus_tokens=int(len(stream)),
        first_loss=sum(head) / len(head),
        final_loss=sum(tail) / len(tail),
        wall_s=round(wall, 1),
        tokens_per_s=round(steps * batch_size * seq_len / wall, 1),
        seed=seed,
        corpus_digest=digest,
    )
    (out_dir / "training.json").write_text(json.dumps(asdict(result), indent=2))
    log.info("target.train.done", **asdict(result))
    return result
