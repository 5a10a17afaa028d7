"""`toolflash bench`: speculative vs toolflash's own target-only (AR) decoding per prompt kind,
side by side; with no flags, the run behind the README's speed figures for the default pair
(`OPENBLAS_NUM_THREADS=1 toolflash bench`). `--baseline mlx-lm` compares against plain mlx-lm."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, get_args

from toolflash.commands.serve_settings import ServeSettings

# Prompts per kind: all 30 held-out prompts of each kind (the README's figures; about a minute
# for the default pair on a 2-core CPU); the mlx-lm comparison runs 7 variants x 3 repetitions.
PER_KIND = 30
PER_KIND_BASELINE = 4


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
    p.add_argument(
        "--per-kind",
        type=int,
        default=None,
        help=f"prompts per kind (default {PER_KIND}, {PER_KIND_BASELINE} with --baseline)",
    )
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per run (default 128)")
    p.add_argument("--repeats", type=int, default=None, help="default 1 (3 with --baseline)")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument(
        "--draft-length",
        default=ServeSettings.model_fields["draft_length"].default,
        help="adaptive, fixed, or both side by side (adaptive,fixed): whether a cycle may "
        "draft less than the block after rejected drafts",
    )
    p.add_argument(
        "--temperature",
        default="0",
        help="temperature, or a comma list run side by side (e.g. 0,0.6,1.0); 0 is greedy",
    )
    p.add_argument("--seed", type=int, default=0, help="first seed of the sampled runs")
    p.add_argument("--json", dest="json_out", default=None, help="also write the report here")
    p.add_argument(
        "--baseline",
        choices=["mlx-lm"],
        default=None,
        help="compare against plain mlx-lm AR (generate_step) in the same run: toolflash AR, "
        "spec (fixed and adaptive draft length) and the default policy (cold and warm), "
        "greedy, ratios to mlx-lm per kind (--max-tokens default 128, --repeats default 3)",
    )
    p.add_argument(
        "--stop",
        default="eos,length",
        help="with --baseline: eos (natural end), length (EOS ignored), or both",
    )
    p.add_argument(
        "--variants",
        default=None,
        help="with --baseline: comma list of ar, lookup, spec-fixed, spec-adaptive, "
        "policy-cold, policy-warm (default: all)",
    )
    p.add_argument("--plot", default=None, help="with --baseline: write a PNG of the ratios")
    p.add_argument(
        "--policy-config",
        action="append",
        default=[],
        metavar="FILE",
        help="with --baseline: extra policy YAML files for the policy rows, applied after the "
        "shipped ones as serve's --policy-config (repeatable): a policy setting's A/B is two "
        "runs of one tree",
    )
    p.add_argument(
        "--calibration-dir",
        default=None,
        metavar="DIR",
        help="with --baseline: the policy rows' calibration state: measured into DIR on the "
        "first run, reused as it is by every later run given DIR, of this tree or another (runs "
        "compared on the cold policy share one; default: a fresh calibration per run). A directory "
        "of its own: a server's state directory holds what it learned as well",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    from toolflash.bench import format_report, load_prompts, run_benchmark
    from toolflash.engine.api import DraftLength
    from toolflash.engine.factory import assets_dir, build_engine
    from toolflash.gateway.logs import configure_logging

    path = Path(args.prompts) if args.prompts else assets_dir() / "bench_prompts.jsonl"
    prompts = load_prompts(str(path))
    if args.kinds:
        wanted = set(args.kinds.split(","))
        prompts = [p for p in prompts if p.kind in wanted]
    per_kind = args.per_kind or (PER_KIND_BASELINE if args.baseline else PER_KIND)
    by_kind: dict[str, int] = {}
    selected = []
    for p in prompts:
        if by_kind.get(p.kind, 0) < per_kind:
            by_kind[p.kind] = by_kind.get(p.kind, 0) + 1
            selected.append(p)
    try:
        temperatures = [float(t) for t in args.temperature.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--temperature: not a number list: {args.temperature!r}") from None
    if not temperatures or any(not 0 <= t <= 2 for t in temperatures):
        raise SystemExit("--temperature: each value must be between 0 and 2")
    draft_lengths = [d.strip() for d in args.draft_length.split(",") if d.strip()]
    known = get_args(DraftLength)
    if not draft_lengths or any(d not in known for d in draft_lengths):
        raise SystemExit(f"--draft-length: one of {', '.join(known)} or a comma list of them")
    # Loading and the policy log at info: the progress bar and the table are the run's output.
    configure_logging(json_lines=False, level=os.environ.get("TOOLFLASH_LOG_LEVEL", "warning"))
    engine = build_engine(args.model, args.draft, block_size=args.block_size)
    if args.baseline:
        return _run_baseline(args, engine, selected)
    print(
        f"toolflash bench: {engine.model_id}, speculative vs toolflash's own AR decoding, "
        f"{per_kind} prompts per kind, {args.max_tokens} new tokens (against plain mlx-lm: "
        "--baseline mlx-lm)",
        file=sys.stderr,
    )
    report = run_benchmark(
        engine,
        selected,
        args.max_tokens,
        args.repeats or 1,
        temperatures,
        args.seed,
        draft_lengths,
        progress=not args.no_progress,
    )
    report["command"] = " ".join(["toolflash", *sys.argv[1:]])
    print(format_report(report))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    return 0


def _run_baseline(args: argparse.Namespace, engine: Any, prompts: list[Any]) -> int:
    from toolflash.baseline_bench import (
        VARIANTS,
        calibrated_policies,
        format_comparison,
        plot_comparison,
        run_comparison,
    )

    stops = [s.strip() for s in args.stop.split(",") if s.strip()]
    if not stops or any(s not in ("eos", "length") for s in stops):
        raise SystemExit("--stop: eos, length or eos,length")
    variants = tuple(VARIANTS)
    if args.variants:
        variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            raise SystemExit(
                f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}"
            )
    policy_factory = None
    if args.policy_config or args.calibration_dir:
        from toolflash.policy.config import PolicyFileError

        try:
            policy_factory = calibrated_policies(
                engine, not args.no_progress, args.policy_config, args.calibration_dir
            )
        except PolicyFileError as exc:
            raise SystemExit(f"--policy-config: {exc}") from None
        except OSError as exc:  # a policy file or the calibration directory
            raise SystemExit(f"the policy rows' files: {exc}") from None
    report = run_comparison(
        engine,
        prompts,
        max_tokens=args.max_tokens,
        repeats=args.repeats or 3,
        stops=stops,
        variants=variants,
        seed=args.seed,
        progress=not args.no_progress,
        policy_factory=policy_factory,
    )
    report["command"] = " ".join(["toolflash", *sys.argv[1:]])
    print(format_comparison(report))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    if args.plot and not plot_comparison(report, args.plot):
        print("--plot: matplotlib is not installed; no plot written", file=sys.stderr)
    return 0
