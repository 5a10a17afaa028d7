"""A batched verify's drafts: B rows drafting one by one (a drafter forward each, serially, as a
row alone drafts) against one drafter forward for all B (`engine/batching/drafts.py`), same
sessions, interleaved, median per way.

    python benchmarks/batch_drafts.py --model toolflash-tiny-qwen35 --rows 2,4,8 --block 16

Each row is a session prefilled on a prompt of its own length, so the contexts differ and the
batched forward masks the padding, as in a running batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.batching.drafts import dflash_logits
from toolflash.engine.factory import build_engine
from toolflash.engine.session import GenerationSession, dflash_proposal


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="toolflash-tiny-qwen35")
    p.add_argument("--draft", default=None, help="a drafter folder (default: the model's own)")
    p.add_argument("--rows", default="2,4,8")
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=200, help="the first row's; +37 a row")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    engine = build_engine(args.model, args.draft, mode="spec")
    results = []
    for b in (int(r) for r in args.rows.split(",")):
        rows = []
        for k in range(b):
            session = GenerationSession(engine.target, engine.drafter)
            session.prefill([(7 * i + 3 + k) % 250 for i in range(args.prompt_tokens + 37 * k)])
            rows.append(session)
        alone, together = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            mx.eval([dflash_proposal(s, args.block) for s in rows])
            t1 = time.perf_counter()
            mx.eval(dflash_logits(rows, args.block))
            t2 = time.perf_counter()
            alone.append(t1 - t0)
            together.append(t2 - t1)
        one_by_one = statistics.median(alone[3:]) * 1e3
        one_forward = statistics.median(together[3:]) * 1e3
        results.append(
            {
                "rows": b,
                "one_by_one_ms": round(one_by_one, 3),
                "one_forward_ms": round(one_forward, 3),
                "speedup": round(one_by_one / one_forward, 2),
            }
        )
        print(
            f"{b} rows: one by one {one_by_one:.2f} ms, one forward {one_forward:.2f} ms "
            f"({one_by_one / one_forward:.2f}x)",
            flush=True,
        )
    report = {
        "command": "python benchmarks/batch_drafts.py " + " ".join(argv or sys.argv[1:]),
        "model": args.model,
        "device": str(mx.default_device()),
        "block": args.block,
        "rows": results,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
