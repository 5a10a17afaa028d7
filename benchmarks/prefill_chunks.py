"""Dense prefill time per chunk size: toolflash's session against mlx-lm's model fed the same
chunks, same weights, same token ids, interleaved. It shows which chunk size a device wants
and whether a gap to mlx-lm comes from chunking or from the forward itself.

    python benchmarks/prefill_chunks.py --model DIR --length 16384 --chunks 512,1024,2048,4096
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.factory import build_engine
from toolflash.engine.session import GenerationSession


def mlx_lm_prefill(model: Any, ids: list[int], chunk: int) -> float:
    """mlx-lm's model fed `chunk` tokens at a time, evaluated as `generate_step` evaluates its
    prefill: the cache after each chunk, the logits only after the last one (a slice of the
    logits is still the whole lm_head over the chunk, which generate_step never asks for)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    for pos in range(0, len(ids), chunk):
        logits = model(mx.array([ids[pos : pos + chunk]]), cache=cache)
        last = [logits[:, -1]] if pos + chunk >= len(ids) else []
        mx.eval(last, [c.state for c in cache])
    return time.perf_counter() - t0


def toolflash_prefill(engine: Any, ids: list[int], chunk: int) -> float:
    session = GenerationSession(engine.target, None, prefill_chunk=chunk)
    t0 = time.perf_counter()
    session.prefill(ids)
    mx.eval(session.last_logits)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--chunks", default="512,1024,2048,4096")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    engine = build_engine(args.model, no_draft=True, mode="ar")
    mx.random.seed(0)
    high = min(engine.target.vocab_size, 4096) - 1  # ids the tiny tokenizer knows
    ids = [int(x) for x in mx.random.randint(10, high, (args.length,)).tolist()]
    chunks = [int(c) for c in args.chunks.split(",")]
    runs: dict[str, list[float]] = {}
    mlx_lm_prefill(engine.target.model, ids[:1024], 512)  # warm-up (kernel compilation)
    toolflash_prefill(engine, ids[:1024], 512)
    for rep in range(args.repeats):
        for chunk in chunks if rep % 2 == 0 else reversed(chunks):
            for name in ("mlx-lm", "toolflash"):
                if name == "mlx-lm":
                    wall = mlx_lm_prefill(engine.target.model, ids, chunk)
                else:
                    wall = toolflash_prefill(engine, ids, chunk)
                runs.setdefault(f"{name}/{chunk}", []).append(wall)
                print(f"rep {rep} {name:9} chunk {chunk:5}: {wall:.3f} s", flush=True)
    best = min(statistics.median(v) for k, v in runs.items() if k.startswith("mlx-lm/"))
    rows = [
        {
            "variant": key,
            "median_s": round(statistics.median(walls), 4),
            "tok_s": round(args.length / statistics.median(walls)),
            "vs_best_mlx_lm": round(best / statistics.median(walls), 3),
        }
        for key, walls in runs.items()
    ]
    for r in rows:
        print(
            f"{r['variant']:16} {r['median_s']:8.3f} s {r['tok_s']:8} tok/s {r['vs_best_mlx_lm']:.2f}x"
        )
    report = {
        "model": args.model,
        "length": args.length,
        "device": str(mx.default_device()),
        "repeats": args.repeats,
        "rows": rows,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
