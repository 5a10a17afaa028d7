"""`toolflash train-draft`: train a DFlash drafter against a frozen target and measure it.

Distils the target's greedy continuations of --data (batched, --distill-batch prompts per
forward), trains the drafter on them, writes the z-lab format (config.json + model.safetensors)
and training_report.json to --out, and prints the real-loop tokens per cycle per prompt kind on
held-out prompts. `toolflash zoo prompts` writes a large distillation prompt pool for --data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="mlx-lm target model directory")
    parser.add_argument(
        "--data",
        required=True,
        help="prompts: JSONL file or directory (chat requests, text prompts, recorded traffic)",
    )
    parser.add_argument("--out", required=True, help="output directory for the drafter")
    parser.add_argument("--layers", type=int, help="draft layers (default: target layers / 4, 1-5)")
    parser.add_argument(
        "--block-size", type=int, help="block size (default: 8 for tiny targets, else 16)"
    )
    parser.add_argument(
        "--target-layers", help="comma-separated target layer ids to read features from"
    )
    parser.add_argument(
        "--warm-start",
        action="store_true",
        help="start the draft layers from the target's last decoder layers",
    )
    parser.add_argument("--mask-token-id", type=int, help="default: the tokenizer's <|mask|>")
    parser.add_argument("--steps", type=int, help="optimizer steps (overrides --epochs)")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--anchors", type=int, help="blocks per sequence (default: ~2x response/B)")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-new-tokens", type=int, default=256, help="greedy continuation length"
    )
    parser.add_argument("--max-len", type=int, default=512, help="tokens per training example")
    parser.add_argument(
        "--distill-batch",
        type=positive_int,
        default=64,
        metavar="N",
        help="prompts decoded together during distillation (mlx-lm batch generator, same "
        "greedy tokens as one at a time); 1 = one engine session per prompt, the fallback "
        "where batched generation fails (e.g. Qwen3.5 hybrids on MLX's CUDA backend)",
    )
    parser.add_argument(
        "--use-recorded",
        action="store_true",
        help="train on recorded assistant outputs of traffic records instead of regenerating",
    )
    parser.add_argument(
        "--eval-prompts", help="held-out prompts (default: --eval-count prompts of --data)"
    )
    parser.add_argument("--eval-count", type=int, default=16)
    parser.add_argument("--eval-max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--limit", type=int, help="train on this many prompts drawn at random (seeded)"
    )
    parser.add_argument("--no-compile", action="store_true", help="do not mx.compile the step")
    parser.add_argument("--no-progress", action="store_true")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    from toolflash.engine.factory import load_target
    from toolflash.training.data import (
        DataError,
        load_prompt_records,
        split_holdout,
        stop_token_ids,
        subsample,
    )
    from toolflash.training.draft_config import DraftSetupError, resolve_mask_token_id
    from toolflash.training.pipeline import DraftJob, train_draft
    from toolflash.training.trainer import TrainConfig

    target, tokenizer, config = load_target(Path(args.target))
    try:
        records = load_prompt_records(Path(args.data), tokenizer, args.use_recorded)
        if args.eval_prompts:
            train_records = records
            eval_records = load_prompt_records(Path(args.eval_prompts), tokenizer)
        else:
            train_records, eval_records = split_holdout(records, args.eval_count, args.seed)
        if args.limit:
            train_records = subsample(train_records, args.limit, args.seed)
        mask_id = args.mask_token_id
        if mask_id is None:
            mask_id = resolve_mask_token_id(tokenizer, target.vocab_size)
    except (DataError, DraftSetupError) as exc:
        print(f"train-draft: {exc}", file=sys.stderr)
        return 2
    layer_ids = (
        [int(x) for x in args.target_layers.split(",") if x.strip()] if args.target_layers else None
    )
    job = DraftJob(
        mask_token_id=mask_id,
        layers=args.layers,
        block_size=args.block_size,
        target_layer_ids=layer_ids,
        max_new_tokens=args.max_new_tokens,
        max_len=args.max_len,
        distill_batch=args.distill_batch,
        eval_max_new_tokens=args.eval_max_new_tokens,
        warm_start=args.warm_start,
        train=TrainConfig(
            steps=args.steps,
            epochs=args.epochs,
            batch_size=args.batch_size,
            anchors_per_seq=args.anchors,
            lr=args.lr,
            seed=args.seed,
            compile=not args.no_compile,
        ),
    )
    try:
        result = train_draft(
            target,
            config,
            train_records,
            eval_records,
            stop_token_ids(tokenizer),
            Path(args.out),
            job,
            progress=not args.no_progress,
            extra_report={"target_path": str(args.target), "data_path": str(args.data)},
        )
    except DraftSetupError as exc:
        print(f"train-draft: {exc}", file=sys.stderr)
        return 2
    print(f"drafter written to {result.out_dir}")
    if result.evaluation is not None and not result.evaluation.lossless:
        print("train-draft: speculative output differs from target-only output", file=sys.stderr)
        return 1
    return 0
