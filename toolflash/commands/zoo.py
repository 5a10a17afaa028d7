"""`toolflash zoo`: build the tiny model family from scratch, or print greedy samples from it.

Usage:
    toolflash zoo build --out DIR [--seed S] [--corpus-size BYTES] [--steps N | --steps-qwen3 N ...] [--quick]
    toolflash zoo sample --model DIR (--prompt TEXT | --kind code) [--max-tokens N] [--no-thinking]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="zoo_command", metavar="ACTION", required=True)

    build = sub.add_parser("build", help="corpus -> tokenizer -> tiny qwen3 and qwen3.5 targets")
    build.add_argument("--out", type=Path, required=True, help="output directory")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--corpus-size", type=int, default=None, help="corpus bytes (default 3 MB)")
    build.add_argument("--steps", type=int, default=None, help="training steps for every target")
    build.add_argument("--steps-qwen3", type=int, default=None)
    build.add_argument("--steps-qwen35", type=int, default=None)
    build.add_argument(
        "--family",
        choices=["qwen3", "qwen3_5"],
        action="append",
        help="train only these targets (repeatable; default both)",
    )
    build.add_argument(
        "--quick", action="store_true", help="small corpus and 20 steps (smoke test, minutes)"
    )
    build.add_argument(
        "--drafters",
        action="store_true",
        help="also train one DFlash drafter per target (distillation prompts from the corpus, "
        "evaluated with the real loop on held-out prompts)",
    )
    build.add_argument("--draft-prompts", type=int, default=300, help="distillation prompts")
    build.add_argument("--draft-steps", type=int, default=900, help="drafter training steps")

    sample = sub.add_parser("sample", help="greedy samples through the chat template")
    sample.add_argument("--model", type=Path, required=True, help="a target directory")
    group = sample.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt", help="user message")
    group.add_argument(
        "--kind",
        choices=["free_text", "code", "tool_call", "json"],
        help="use held-out evaluation prompts of this kind",
    )
    sample.add_argument("-n", type=int, default=1, help="number of eval prompts with --kind")
    sample.add_argument("--max-tokens", type=int, default=160)
    sample.add_argument("--no-thinking", action="store_true", help="enable_thinking=False")
    sample.add_argument(
        "--tools",
        nargs="*",
        default=None,
        help="offer these catalog tools with --prompt (e.g. get_weather read_file)",
    )
    sample.add_argument("--xml", action="store_true", help="qwen3_coder tool-call format")


def run(args: argparse.Namespace) -> int:
    if args.zoo_command == "build":
        return _build(args)
    return _sample(args)


def _build(args: argparse.Namespace) -> int:
    from toolflash.zoo.build import QUICK_SIZE, QUICK_STEPS, build_family, family_size_mb
    from toolflash.zoo.corpus import DEFAULT_SIZE
    from toolflash.zoo.target_configs import FAMILIES

    size = args.corpus_size or (QUICK_SIZE if args.quick else DEFAULT_SIZE)
    default_steps = args.steps or (QUICK_STEPS if args.quick else None)
    steps: dict[Any, int] = {}
    for family, override in (("qwen3", args.steps_qwen3), ("qwen3_5", args.steps_qwen35)):
        chosen = override or default_steps
        if chosen:
            steps[family] = int(chosen)
    start = time.perf_counter()
    build = build_family(
        args.out,
        seed=args.seed,
        corpus_size=size,
        steps=steps,
        families=tuple(args.family or FAMILIES),
    )
    summary = build.to_json()
    summary.pop("training")
    summary["total_seconds"] = round(time.perf_counter() - start, 1)
    summary["size_mb"] = family_size_mb(args.out)
    summary["final_loss"] = {k: round(v.final_loss, 3) for k, v in build.training.items()}
    if args.drafters:
        summary["drafters"] = _drafters(args, build)
        summary["total_seconds"] = round(time.perf_counter() - start, 1)
        summary["size_mb"] = family_size_mb(args.out)
    print(json.dumps(summary, indent=2))
    return 0


def _drafters(args: argparse.Namespace, build: Any) -> dict[str, Any]:
    """Prompt files, then one drafter per target: DIR/<target>-dflash."""
    from toolflash.zoo.drafters import (
        distillation_prompts,
        held_out_prompts,
        records_from_jsonl,
        train_family_drafter,
        write_prompts,
    )

    records = records_from_jsonl(args.out / "corpus.jsonl")
    train_file = args.out / "prompts_train.jsonl"
    eval_file = args.out / "prompts_eval.jsonl"
    write_prompts(distillation_prompts(records, args.draft_prompts, args.seed), train_file)
    write_prompts(held_out_prompts(6, args.seed), eval_file)
    out: dict[str, Any] = {}
    for family, target_dir in build.target_dirs.items():
        t0 = time.perf_counter()
        report = train_family_drafter(
            target_dir,
            target_dir.parent / f"{target_dir.name}-dflash",
            train_file,
            eval_file,
            steps=args.draft_steps,
            max_new_tokens=128,
            seed=args.seed,
        )
        evaluation = report.get("evaluation") or {}
        out[family] = {
            "seconds": round(time.perf_counter() - t0, 1),
            "tokens_per_cycle": (evaluation.get("overall") or {}).get("tokens_per_cycle"),
            "lossless": evaluation.get("lossless"),
        }
    return out


def _sample(args: argparse.Namespace) -> int:
    import mlx.core as mx
    from mlx_lm import generate, load

    from toolflash.zoo.corpus import eval_prompts
    from toolflash.zoo.quality import check_tool_calls, parses_as_json
    from toolflash.zoo.records import Prompt
    from toolflash.zoo.tools_catalog import BY_NAME

    loaded = load(str(args.model))
    model, tokenizer = loaded[0], loaded[1]
    model.set_dtype(mx.float32)  # stored bf16; CPU matmuls are fast only in float32
    if args.kind:
        prompts = eval_prompts(args.kind, n=args.n)
    else:
        tools = [BY_NAME[name].schema() for name in args.tools or []]
        prompts = [
            Prompt(
                kind="free_text",
                messages=[{"role": "user", "content": args.prompt}],
                tools=tools,
                enable_thinking=not args.no_thinking,
                tool_call_format="qwen3_coder" if args.xml else "hermes",
            )
        ]
    well_formed = 0
    for prompt in prompts:
        if args.no_thinking:
            prompt = dataclasses.replace(prompt, enable_thinking=False)
        text = prompt.render(tokenizer)
        start = time.perf_counter()
        out = generate(model, tokenizer, text, max_tokens=args.max_tokens)
        took = time.perf_counter() - start
        print(f"=== {prompt.kind} | {prompt.messages[-1]['content'][:120]!r}")
        print(out)
        check = ""
        if prompt.kind == "tool_call" or (prompt.tools and "<tool_call>" in out):
            calls = check_tool_calls(out, prompt.tool_call_format, prompt.tools)
            well_formed += calls.well_formed
            check = f", {len(calls.parsed)}/{calls.blocks} tool calls parsed: {calls.parsed}"
        elif prompt.kind == "json":
            ok = parses_as_json(out)
            well_formed += ok
            check = f", parses as JSON: {ok}"
        print(f"--- {len(tokenizer.encode(out))} tokens in {took:.2f}s{check}")
    if args.kind in ("tool_call", "json"):
        print(f"well-formed: {well_formed}/{len(prompts)}")
    return 0
