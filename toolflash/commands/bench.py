"""`toolflash bench`: speculative vs target-only decoding per prompt kind, side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="target (default: the embedded tiny model)")
    p.add_argument("--draft", default=None, help="DFlash drafter")
    p.add_argument(
        "--prompts",
        default=None,
        help="JSONL of {kind, messages, tools?} (default: the held-out prompts shipped with "
        "the embedded models)",
    )
    p.add_argument("--kinds", default=None, help="comma-separated kinds to run (default: all)")
    p.add_argument("--per-kind", type=int, default=4, help="prompts per kind")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--json", dest="json_out", default=None, help="also write the report here")


def run(args: argparse.Namespace) -> int:
    from toolflash.bench import format_report, load_prompts, run_benchmark
    from toolflash.engine.factory import assets_dir, build_engine

    path = Path(args.prompts) if args.prompts else assets_dir() / "bench_prompts.jsonl"
    prompts = load_prompts(str(path))
    if args.kinds:
        wanted = set(args.kinds.split(","))
        prompts = [p for p in prompts if p.kind in wanted]
    by_kind: dict[str, int] = {}
    selected = []
    for p in prompts:
        if by_kind.get(p.kind, 0) < args.per_kind:
            by_kind[p.kind] = by_kind.get(p.kind, 0) + 1
            selected.append(p)
    engine = build_engine(args.model, args.draft, block_size=args.block_size)
    report = run_benchmark(engine, selected, args.max_tokens, args.repeats)
    print(format_report(report))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    return 0
