"""Distillation throughput: the target's greedy continuations one prompt at a time (an engine
session per prompt, `--distill-batch 1`) vs batched (mlx-lm's BatchGenerator, the default),
on the shipped qwen3-tiny, and whether both give the same tokens.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \\
        python benchmarks/distill_throughput.py [--prompts 64] [--tokens 64] [--batches 16,64:1]

Prompts come from `toolflash.zoo.prompt_pool.distillation_pool` (what `toolflash zoo prompts`
writes), rendered with the target's chat template. No stop ids, so every prompt decodes
exactly --tokens tokens and both paths do the same work. `B:G` in --batches decodes B
sequences together and prefills G prompts at a time (default `default_prefill_group()`). --reps
interleaves the variants and reports the median time. Writes distill_throughput.json to --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script

from toolflash.blas import blas_in_use
from toolflash.engine.factory import load_target
from toolflash.training.batched import batched_continuations, default_prefill_group
from toolflash.training.generation import generate
from toolflash.zoo.prompt_pool import distillation_pool

TARGET = Path(__file__).resolve().parents[1] / "toolflash/assets/tiny/qwen3-tiny"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=TARGET)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--batches", default="16,64", help="comma-separated batch sizes, B or B:prefill_group"
    )
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)

    target, tokenizer, _ = load_target(args.target)
    pool = distillation_pool(args.prompts, args.seed, tokenizer=tokenizer, max_tokens=1536)
    prompts = [tokenizer.encode(p.render(tokenizer), add_special_tokens=False) for p in pool]
    generate(target, prompts[0], 4, ())  # warm-up: first-call allocations
    variants = [(1, 1)] + [_variant(v) for v in args.batches.split(",") if v.strip()]
    times: dict[tuple[int, int], list[float]] = {v: [] for v in variants}
    outputs: dict[tuple[int, int], list[list[int]]] = {}
    for _ in range(args.reps):
        for size, group in variants:
            t0 = time.perf_counter()
            if size == 1:
                outputs[(size, group)] = [
                    generate(target, p, args.tokens, ()).output for p in prompts
                ]
            else:
                outputs[(size, group)] = batched_continuations(
                    target.model, prompts, args.tokens, (), size, prefill_group=group
                )
            times[(size, group)].append(time.perf_counter() - t0)
    reference = outputs[(1, 1)]
    rows = [
        _row(
            size, group, outputs[(size, group)], statistics.median(times[(size, group)]), reference
        )
        for size, group in variants
    ]

    report = {
        "benchmark": "distill_throughput",
        "target": str(args.target),
        "prompts": len(prompts),
        "prompt_tokens": sum(len(p) for p in prompts),
        "max_new_tokens": args.tokens,
        "reps": args.reps,
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "mlx": getattr(mx, "__version__", "?"),
            "device": str(mx.default_device()),
            "blas": blas_in_use(),
        },
        "runs": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distill_throughput.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{len(prompts)} prompts ({report['prompt_tokens']} prompt tokens), {args.tokens} new")
    print(f"{'batch':>5} {'prefill':>7} {'seconds':>8} {'tok/s':>8} {'speedup':>8} {'same':>6}")
    for r in rows:
        print(
            f"{r['batch']:>5} {r['prefill_group']:>7} {r['seconds']:>8.2f} {r['tokens_per_s']:>8.1f} "
            f"{rows[0]['seconds'] / r['seconds']:>7.2f}x {r['same_as_per_prompt']:>6}"
        )
    return 0


def _variant(text: str) -> tuple[int, int]:
    size, _, group = text.partition(":")
    return int(size), int(group) if group else default_prefill_group()


def _row(
    batch: int, group: int, outputs: list[list[int]], seconds: float, reference: list[list[int]]
) -> dict[str, Any]:
    tokens = sum(len(o) for o in outputs)
    same = sum(a == b for a, b in zip(outputs, reference, strict=True))
    first_diff = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        for a, b in zip(outputs, reference, strict=True)
    ]
    return {
        "batch": batch,
        "prefill_group": min(group, batch),
        "seconds": round(seconds, 3),
        "tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1),
        "same_as_per_prompt": f"{same}/{len(outputs)}",
        "first_difference_at": [d for d in first_diff if d is not None],
    }


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
