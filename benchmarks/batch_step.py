"""Where a batched AR step's time goes: one request decoding alone (per token) against
`EngineBatcher` with B AR rows in steady state (per step), and the batched target forward
alone (per step, its one host sync included), same target, same prompts.

    python benchmarks/batch_step.py --model DIR --rows 2,4,8 --steps 32
    python benchmarks/batch_step.py --mode spec --rows 2,4,8   # batched verify steps

With `--mode spec` every row drafts its own block and one forward verifies them all (the
engine's drafter; `spec_rows` = B): tokens per second count the tokens the timed steps
committed, against one request decoding alone in spec mode. Decode only: no prefill.

A batched step that costs far more than its forward is host work per step (graph building
that no pipelining hides, per-row commits); a forward that grows with B is device work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
from concurrent_engine import requests
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.api import TokenEvent
from toolflash.engine.batching.batcher import EngineBatcher
from toolflash.engine.factory import build_engine

ALONE_TOKENS = 128


def alone_ms(engine: Any, request: Any) -> float:
    """Milliseconds per token of one request decoding alone, first token excluded."""
    stamps: list[float] = []
    tokens = 0
    for e in engine.generate(request):
        if isinstance(e, TokenEvent) and e.token_ids:
            stamps.append(time.perf_counter())
            tokens += len(e.token_ids) if len(stamps) > 1 else 0
    return (stamps[-1] - stamps[0]) / max(tokens, 1) * 1e3


def batched_ms(
    engine: Any, reqs: list[Any], rows: int, steps: int, spec: bool
) -> tuple[float, float, float]:
    """(ms per batched step with `rows` rows in steady state, tokens committed per step, ms
    per batched AR forward alone)."""
    batcher = EngineBatcher(engine, rows, spec_rows=rows if spec else 0, prefill_thread=False)
    for i, r in enumerate(reqs[:rows]):
        batcher.add(i, r)
    for _ in range(10_000):  # admissions and prefills, until every request is a batch row
        if batcher.rows.size == rows:
            break
        batcher.step()
    else:
        raise RuntimeError(f"{rows} requests never formed a batch")
    for _ in range(4):
        batcher.step()
    walls = []
    tokens = 0
    for _ in range(steps):
        t0 = time.perf_counter()
        out = batcher.step()
        walls.append(time.perf_counter() - t0)
        tokens += sum(
            len(e.token_ids) for _, events in out for e in events if isinstance(e, TokenEvent)
        )
    forwards = []
    for _ in range(steps):
        t0 = time.perf_counter()
        res = batcher.rows.forward([0] * rows, ())
        mx.eval(mx.argmax(res.logits[:, -1], axis=-1))
        forwards.append(time.perf_counter() - t0)
    per_step = tokens / steps
    return statistics.fmean(walls) * 1e3, per_step, statistics.median(forwards) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="toolflash-tiny-qwen35")
    p.add_argument("--draft", default=None, help="a drafter folder (default: the model's own)")
    p.add_argument("--rows", default="2,4,8")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--mode", choices=("ar", "spec"), default="ar")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    spec = args.mode == "spec"
    engine = build_engine(args.model, args.draft, no_draft=not spec, mode=args.mode)
    row_counts = [int(r) for r in args.rows.split(",")]
    if min(row_counts) < 2:
        raise SystemExit("--rows: batches of 2 or more (one request decodes alone)")
    budget = args.steps * (48 if spec else 3) + 64  # no row may finish while it is timed
    reqs = requests(engine, max(row_counts), budget, ignore_eos=True)
    reqs = [r.__class__(**{**r.__dict__, "mode": args.mode}) for r in reqs]
    # One request alone: the mean over the requests the batches run (their kinds differ), each
    # for at most ALONE_TOKENS: the budget above is sized for a trained drafter's blocks, and a
    # random one (a shape-true target on the device) commits a token a cycle.
    alone = [replace(r, max_tokens=min(r.max_tokens, ALONE_TOKENS)) for r in reqs]
    alone_ms(engine, alone[0])  # warm-up
    solo = statistics.fmean(alone_ms(engine, r) for r in alone)
    rows = []
    for b in row_counts:
        step, per_step, forward = batched_ms(engine, reqs, b, args.steps, spec)
        rows.append(
            {
                "rows": b,
                "step_ms": round(step, 2),
                "tokens_per_step": round(per_step, 2),
                "ar_forward_ms": round(forward, 2),
                "tokens_per_s": round(per_step / step * 1e3, 1),
                "vs_alone": round(per_step / step * solo, 2),
            }
        )
        print(
            f"{b} rows: step {step:.2f} ms, {per_step:.1f} tokens per step "
            f"(AR forward alone {forward:.2f} ms), {per_step / step * 1e3:.0f} tok/s, "
            f"{per_step / step * solo:.2f}x one request alone",
            flush=True,
        )
    report = {
        "command": "python benchmarks/batch_step.py " + " ".join(argv or sys.argv[1:]),
        "model": args.model,
        "device": str(mx.default_device()),
        "mode": args.mode,
        "alone_ms_per_token": round(solo, 3),
        "rows": rows,
    }
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
