"""The whole `train-draft` job: distill, train, write the z-lab drafter, reload it through the
engine's loader, and measure it with the real draft-verify loop on held-out prompts.

`train_draft` is the Python entry point (the zoo builder calls it with token sequences);
`toolflash train-draft` parses its command line into the same call.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import structlog
from mlx.utils import tree_flatten

from toolflash.engine.draft_loading import TargetInfo, load_draft, save_draft
from toolflash.engine.targets.base import TargetAdapter

from .data import PromptRecord, as_records, distill
from .draft_config import draft_config_for, init_drafter, init_from_target
from .evaluate import EvalReport, evaluate_drafter, format_report
from .trainer import TrainConfig, TrainResult, train_drafter

log = structlog.get_logger(__name__)

REPORT_FILE = "training_report.json"


@dataclass(frozen=True)
class DraftJob:
    """Drafter shape, data limits and evaluation settings of one training job."""

    mask_token_id: int
    layers: int | None = None
    block_size: int | None = None
    target_layer_ids: list[int] | None = None
    max_new_tokens: int = 256  # distillation: greedy continuation length
    max_len: int = 512  # prompt + response tokens per training example
    # Distillation prompts decoded per forward (mlx-lm batch generator); 1 = one engine
    # session per prompt (the fallback where batched generation fails on a backend).
    distill_batch: int = 64
    eval_max_new_tokens: int = 128
    warm_start: bool = False  # start the draft layers from the target's last layers
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class DraftJobResult:
    """What the job produced: the drafter directory, training and real-loop figures."""

    out_dir: Path
    training: TrainResult
    evaluation: EvalReport | None
    report: dict[str, Any]


def train_draft(
    target: TargetAdapter,
    target_config: dict[str, Any],
    prompts: Sequence[PromptRecord | Sequence[int]],
    eval_prompts: Sequence[PromptRecord | Sequence[int]],
    stop_ids: Iterable[int],
    out_dir: Path,
    job: DraftJob,
    progress: bool = True,
    extra_report: dict[str, Any] | None = None,
) -> DraftJobResult:
    """Train a drafter for `target` on its greedy continuations of `prompts`, write it to
    `out_dir` (config.json, model.safetensors, training_report.json) and evaluate the written
    files with the real loop on `eval_prompts` (skipped when empty)."""
    t_start = time.perf_counter()
    stops = set(stop_ids)
    records = as_records(prompts)
    cfg = draft_config_for(
        target, job.mask_token_id, job.layers, job.block_size, job.target_layer_ids
    )
    drafter = init_drafter(cfg, job.train.seed)
    warm = init_from_target(drafter, target) if job.warm_start else []

    t0 = time.perf_counter()
    examples = distill(
        target, records, stops, job.max_new_tokens, job.max_len, progress, job.distill_batch
    )
    distill_s = time.perf_counter() - t0
    if not examples:
        raise ValueError("no usable training examples (every response was shorter than 2 tokens)")

    training = train_drafter(target, drafter, examples, job.train, progress=progress)
    out_dir = Path(out_dir)
    save_draft(drafter, out_dir)

    evaluation = None
    eval_s = 0.0
    if eval_prompts:
        # Evaluate the files as written, loaded by the engine's own loader and checks.
        info = TargetInfo.from_config(target_config, family=target.family)
        served = load_draft(out_dir, info)
        t0 = time.perf_counter()
        evaluation = evaluate_drafter(
            target, served, eval_prompts, stops, job.eval_max_new_tokens, progress=progress
        )
        eval_s = time.perf_counter() - t0
        print(format_report(evaluation), flush=True)

    kinds: dict[str, int] = {}
    for ex in examples:
        kinds[ex.kind] = kinds.get(ex.kind, 0) + 1
    report: dict[str, Any] = {
        **(extra_report or {}),
        "drafter": {
            "layers": cfg.num_hidden_layers,
            "block_size": cfg.block_size,
            "target_layer_ids": list(cfg.target_layer_ids),
            "mask_token_id": cfg.mask_token_id,
            "hidden_size": cfg.hidden_size,
            "heads": cfg.num_attention_heads,
            "kv_heads": cfg.num_key_value_heads,
            "intermediate_size": cfg.intermediate_size,
            "parameters": _count(drafter.parameters()),
            "warm_started_tensors": len(warm),
        },
        "data": {
            "prompts": len(records),
            "examples": len(examples),
            "examples_by_kind": kinds,
            "response_tokens": sum(ex.response_len for ex in examples),
            "max_new_tokens": job.max_new_tokens,
            "max_len": job.max_len,
            "distill_batch": job.distill_batch,
        },
        "train_config": asdict(job.train),
        "training": training.summary(),
        "evaluation": evaluation.to_dict() if evaluation else None,
        "time_s": {
            "distill": round(distill_s, 2),
            "features": round(training.feature_s, 2),
            "train": round(training.train_s, 2),
            "eval": round(eval_s, 2),
            "total": round(time.perf_counter() - t_start, 2),
        },
        "versions": {"mlx": importlib.metadata.version("mlx"), "python": platform.python_version()},
    }
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    log.info("draft_written", out=str(out_dir), seconds=report["time_s"]["total"])
    return DraftJobResult(out_dir, training, evaluation, report)


def _count(params: Any) -> int:
    flat: list[tuple[str, mx.array]] = tree_flatten(params)  # type: ignore[assignment]
    return sum(int(v.size) for _, v in flat)
