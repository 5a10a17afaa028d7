"""Where a batched AR step's time goes: one request decoding alone (per token) against
`EngineBatcher` with B AR rows in steady state (per step), and the batched target forward
alone (per step, its one host sync included), same target, same prompts.

    python benchmarks/batch_step.py --model DIR --rows 2,4,8 --steps 32

A batched step that costs far more than its forward is host work per step (graph building
that no pipelining hides, per-row commits); a forward that grows with B is device work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from concurrent_engine import requests

from toolflash.engine.api import TokenEvent
from toolflash.engine.batching.batcher import EngineBatcher
from toolflash.engine.factory import build_engine


def alone_ms(engine: Any, request: Any) -> float:
    """Milliseconds per token of one request decoding alone, first token excluded."""
    stamps = [time.perf_counter() for e in engine.generate(request) if isinstance(e, TokenEvent)]
    return (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1) * 1e3


def batched_ms(engine: Any, reqs: list[Any], rows: int, steps: int) -> tuple[float, float]:
    """(ms per batched step with `rows` rows in steady state, ms per batched forward alone)."""
    batcher = EngineBatcher(engine, rows, spec_rows=0)
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
    for _ in range(steps):
        t0 = time.perf_counter()
        batcher.step()
        walls.append(time.perf_counter() - t0)
    forwards = []
    for _ in range(steps):
        t0 = time.perf_counter()
        res = batcher.rows.forward([0] * rows, ())
        mx.eval(mx.argmax(res.logits[:, -1], axis=-1))
        forwards.append(time.perf_counter() - t0)
    return statistics.median(walls) * 1e3, statistics.median(forwards) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="toolflash-tiny-qwen35")
    p.add_argument("--rows", default="2,4,8")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    engine = build_engine(args.model, no_draft=True, mode="ar")
    row_counts = [int(r) for r in args.rows.split(",")]
    if min(row_counts) < 2:
        raise SystemExit("--rows: batches of 2 or more (one request decodes alone)")
    budget = args.steps * 3 + 64  # no row may finish while it is timed
    reqs = requests(engine, max(row_counts), budget, ignore_eos=True)
    reqs = [r.__class__(**{**r.__dict__, "mode": "ar"}) for r in reqs]
    alone_ms(engine, reqs[0])  # warm-up
    solo = statistics.median(alone_ms(engine, reqs[0]) for _ in range(2))
    rows = []
    for b in row_counts:
        step, forward = batched_ms(engine, reqs, b, args.steps)
        rows.append(
            {
                "rows": b,
                "step_ms": round(step, 2),
                "forward_ms": round(forward, 2),
                "tokens_per_s": round(b / step * 1e3, 1),
                "vs_alone": round(b / step * solo, 2),
            }
        )
        print(
            f"{b} rows: step {step:.2f} ms (forward alone {forward:.2f} ms), "
            f"{b / step * 1e3:.0f} tok/s, {b / step * solo:.2f}x one request alone",
            flush=True,
        )
    report = {
        "command": "python benchmarks/batch_step.py " + " ".join(argv or sys.argv[1:]),
        "model": args.model,
        "device": str(mx.default_device()),
        "alone_ms_per_token": round(solo, 3),
        "rows": rows,
    }
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
