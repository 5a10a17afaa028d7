"""`toolflash zoo`: build the tiny model family from scratch, or print greedy samples from it.

Usage:
    toolflash zoo build --out DIR [--seed S] [--corpus-size BYTES] [--steps N | --steps-qwen3 N ...] [--quick]
        [--drafters [--draft-prompts N] [--draft-steps N] [--distill-batch N]]
    toolflash zoo prompts --out FILE [--count N] [--seed S] [--tokenizer DIR] [--corpus FILE]
    toolflash zoo sample --model DIR (--prompt TEXT | --kind code) [--max-tokens N] [--no-thinking]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from toolflash.commands.train_draft import positive_int


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
        help="also train one DFlash drafter per target (distillation prompts from the zoo's "
        "generators, see `zoo prompts`; evaluated with the real loop on held-out prompts)",
    )
    build.add_argument(
        "--draft-prompts", type=int, default=2000, help="distillation prompts (pool size)"
    )
    build.add_argument("--draft-steps", type=int, default=900, help="drafter training steps")
    build.add_argument(
        "--distill-batch",
        type=positive_int,
        default=64,
        help="prompts decoded together during distillation (1 = one at a time)",
    )

    prompts = sub.add_parser(
        "prompts",
        help="write a distillation prompt pool (chat request JSONL for `train-draft --data`)",
        description="Distinct prompts from the zoo's generators, balanced over free text, "
        "code, tool calls and JSON: stdlib code/doc chats from training files only, agent "
        "dialogues and JSON tasks from streams apart from the evaluation stream, never a "
        "held-out evaluation prompt.",
    )
    prompts.add_argument("--out", type=Path, required=True, help="output .jsonl file")
    prompts.add_argument("--count", type=positive_int, default=10_000, help="prompts to write")
    prompts.add_argument("--seed", type=int, default=0)
    prompts.add_argument(
        "--tokenizer",
        type=Path,
        help="a model directory whose chat template measures prompt length "
        "(default: the embedded tiny target)",
    )
    prompts.add_argument("--max-prompt-tokens", type=int, default=1536, help="drop longer prompts")
    prompts.add_argument(
        "--corpus", type=Path, help="also draw the corpus.jsonl conversations of a zoo build"
    )

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
    if args.zoo_command == "prompts":
        return _prompts(args)
    return _sample(args)


def _prompts(args: argparse.Namespace) -> int:
    from collections import Counter

    from transformers import AutoTokenizer

    from toolflash.engine.factory import EMBEDDED_TARGET, assets_dir
    from toolflash.zoo.drafters import records_from_jsonl, write_prompts
    from toolflash.zoo.prompt_pool import distillation_pool

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer or assets_dir() / EMBEDDED_TARGET))
    records = records_from_jsonl(args.corpus) if args.corpus else []
    pool = distillation_pool(
        args.count,
        args.seed,
        records=records,
        tokenizer=tokenizer,
        max_tokens=args.max_prompt_tokens,
    )
    write_prompts(pool, args.out)
    kinds = dict(sorted(Counter(p.kind for p in pool).items()))
    print(json.dumps({"out": str(args.out), "prompts": len(pool), "by_kind": kinds}))
    return 0


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
    from transformers import AutoTokenizer

    from toolflash.zoo.drafters import (
        held_out_prompts,
        records_from_jsonl,
        train_family_drafter,
        write_prompts,
    )
    from toolflash.zoo.prompt_pool import distillation_pool

    records = records_from_jsonl(args.out / "corpus.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(str(build.tokenizer_dir))
    train_file = args.out / "prompts_train.jsonl"
    eval_file = args.out / "prompts_eval.jsonl"
    pool = distillation_pool(args.draft_prompts, args.seed, records=records, tokenizer=tokenizer)
    write_prompts(pool, train_file)
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
            distill_batch=args.distill_batch,
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
