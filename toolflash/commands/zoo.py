"""`toolflash zoo`: build the tiny model family from scratch, sample and score its targets, and
compare a build with the embedded family.

Usage:
    toolflash zoo build --out DIR [--recipe cpu|h200|quick] [--seed S] [--jobs N] [--family F]
        [--targets-only]
        [--corpus-size BYTES] [--steps N | --steps-qwen3 N --steps-qwen35 N]
        [--draft-prompts N] [--draft-steps N] [--distill-batch N]
    toolflash zoo prompts --out FILE [--count N] [--seed S] [--tokenizer DIR] [--corpus FILE]
    toolflash zoo sample --model DIR (--prompt TEXT | --kind code) [--max-tokens N] [--no-thinking]
    toolflash zoo score --model DIR [--model DIR ...] [-n N]
    toolflash zoo compare DIR [--reference DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from toolflash.commands.train_draft import positive_int
from toolflash.zoo.recipes import RECIPES, FamilyRecipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="zoo_command", metavar="ACTION", required=True)

    build = sub.add_parser(
        "build",
        help="the whole tiny family from scratch: corpus, tokenizer, targets, drafters",
        description="Regenerate the tiny family from a named recipe (zoo/recipes.py); the same "
        "recipe and seed give the same files. `cpu` (the default) made the embedded family, in "
        "about 40 minutes on 2 CPU cores with OpenBLAS (`zoo compare` checks a rebuild against "
        "it); `h200` has the first embedded family's settings (a GPU-sized job); `quick` is a "
        "smoke test. The options below override single settings.",
    )
    build.add_argument("--out", type=Path, required=True, help="output directory")
    build.add_argument("--recipe", choices=sorted(RECIPES), default="cpu")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument(
        "--family",
        choices=["qwen3", "qwen3_5"],
        action="append",
        help="build only these targets and their drafters (repeatable; default both)",
    )
    build.add_argument("--targets-only", action="store_true", help="skip the drafters")
    build.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    build.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="families built in parallel worker processes (default: one per family, at most "
        "one per CPU core; 1 = one after the other)",
    )
    build.add_argument("--corpus-size", type=positive_int, default=None, help="corpus bytes")
    build.add_argument("--steps", type=positive_int, default=None, help="every target's steps")
    build.add_argument("--steps-qwen3", type=positive_int, default=None)
    build.add_argument("--steps-qwen35", type=positive_int, default=None)
    build.add_argument(
        "--draft-prompts", type=positive_int, default=None, help="distillation prompts per drafter"
    )
    build.add_argument(
        "--draft-steps", type=positive_int, default=None, help="training steps per drafter"
    )
    build.add_argument(
        "--distill-batch",
        type=positive_int,
        default=None,
        help="prompts decoded together during distillation (1 = one at a time; speed only)",
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

    score = sub.add_parser(
        "score",
        help="held-out answer loss per prompt kind (teacher-forced reference answers)",
        description="Mean negative log-likelihood and top-1 accuracy of each target on the "
        "corpus's reference answers to held-out prompts (N per kind: free text, code, tool "
        "call, JSON), after the whole prompt. Unlike training loss, memorising the corpus "
        "does not lower it.",
    )
    score.add_argument(
        "--model", type=Path, action="append", required=True, help="a target directory (repeat)"
    )
    score.add_argument("-n", type=positive_int, default=24, help="held-out prompts per kind")

    compare = sub.add_parser(
        "compare",
        help="does a built family have the embedded family's files, byte for byte?",
        description="Compare the model files of a `zoo build` output with a reference family "
        "(default: the embedded one) by sha256, file by file; exit status 1 if any differs.",
    )
    compare.add_argument("built", type=Path, help="a `zoo build --out` directory")
    compare.add_argument(
        "--reference", type=Path, default=None, help="default: the embedded family"
    )


def run(args: argparse.Namespace) -> int:
    if args.zoo_command == "build":
        return _build(args)
    if args.zoo_command == "prompts":
        return _prompts(args)
    if args.zoo_command == "compare":
        return _compare(args)
    if args.zoo_command == "score":
        return _score(args)
    return _sample(args)


def _load_target(model_dir: Path) -> tuple[Any, Any]:
    """An mlx-lm target and its tokenizer, in float32 (stored bf16; CPU matmuls are fast only
    in float32)."""
    import mlx.core as mx
    from mlx_lm import load

    loaded = load(str(model_dir))
    model, tokenizer = loaded[0], loaded[1]
    model.set_dtype(mx.float32)
    return model, tokenizer


def _score(args: argparse.Namespace) -> int:
    from toolflash.zoo.drafters import held_out_prompts
    from toolflash.zoo.quality import score_references

    for model_dir in args.model:
        if not (model_dir / "config.json").is_file():
            raise SystemExit(f"toolflash zoo score: not a model directory: {model_dir}")
    prompts = held_out_prompts(args.n)
    for model_dir in args.model:
        model, tokenizer = _load_target(model_dir)
        scores = score_references(model, tokenizer, prompts)
        print(
            json.dumps({"model": str(model_dir), "scores": [dataclasses.asdict(s) for s in scores]})
        )
    return 0


def _compare(args: argparse.Namespace) -> int:
    from toolflash.engine.factory import assets_dir
    from toolflash.zoo.manifest import compare_families, family_files

    reference_dir = args.reference or assets_dir()
    for root in (args.built, reference_dir):
        if not root.is_dir():
            raise SystemExit(f"toolflash zoo compare: no such directory: {root}")
    reference = family_files(reference_dir)
    if not reference:
        raise SystemExit(f"toolflash zoo compare: no family model files under {reference_dir}")
    rows = compare_families(family_files(args.built), reference)
    for row in rows:
        print(f"{row.status:8} {row.path}")
    same = sum(r.status == "same" for r in rows)
    print(f"{same}/{len(rows)} files identical to {reference_dir}")
    return 0 if same == len(rows) else 1


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
    from toolflash.zoo.build import build_family
    from toolflash.zoo.manifest import family_size_mb

    recipe = recipe_from_args(args)
    print(json.dumps({"recipe": recipe.to_json(), "seed": args.seed}, indent=2), flush=True)
    build = build_family(
        args.out, recipe, seed=args.seed, jobs=args.jobs, progress=not args.no_progress
    )
    summary = build.to_json()
    summary.pop("training")
    summary.pop("recipe")
    summary["size_mb"] = family_size_mb(args.out)
    summary["final_loss"] = {k: round(v.final_loss, 3) for k, v in build.training.items()}
    print(json.dumps(summary, indent=2))
    return 0


def recipe_from_args(args: argparse.Namespace) -> FamilyRecipe:
    """The named recipe with the command line's overrides applied."""
    recipe = RECIPES[args.recipe]
    if args.family:
        recipe = recipe.only(tuple(args.family))
    if args.targets_only:
        recipe = recipe.without_drafters()
    if args.corpus_size:
        recipe = dataclasses.replace(recipe, corpus_size=args.corpus_size)
    steps = {"qwen3": args.steps_qwen3 or args.steps, "qwen3_5": args.steps_qwen35 or args.steps}
    targets = {
        family: dataclasses.replace(target, steps=steps[family] or target.steps)
        for family, target in recipe.targets.items()
    }
    overrides: dict[str, Any] = {
        "pool": args.draft_prompts,
        "prompts": args.draft_prompts,
        "steps": args.draft_steps,
        "distill_batch": args.distill_batch,
    }
    chosen = {key: value for key, value in overrides.items() if value}
    drafters = {
        family: dataclasses.replace(drafter, **chosen)
        for family, drafter in recipe.drafters.items()
    }
    return dataclasses.replace(recipe, targets=targets, drafters=drafters)


def _sample(args: argparse.Namespace) -> int:
    from mlx_lm import generate

    from toolflash.zoo.corpus import eval_prompts
    from toolflash.zoo.quality import check_tool_calls, parses_as_json
    from toolflash.zoo.records import Prompt
    from toolflash.zoo.tools_catalog import BY_NAME

    model, tokenizer = _load_target(args.model)
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
    well_formed = right_tool = 0
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
            wanted = [c["function"]["name"] for c in (prompt.reference or {}).get("tool_calls", [])]
            if wanted and calls.parsed:
                right_tool += calls.parsed[0]["name"] == wanted[0]
                check += f", reference calls {wanted[0]}"
        elif prompt.kind == "json":
            ok = parses_as_json(out)
            well_formed += ok
            check = f", parses as JSON: {ok}"
        print(f"--- {len(tokenizer.encode(out))} tokens in {took:.2f}s{check}")
    if args.kind in ("tool_call", "json"):
        print(f"well-formed: {well_formed}/{len(prompts)}")
    if args.kind == "tool_call":
        print(f"first call names the reference's tool: {right_tool}/{len(prompts)}")
    return 0
