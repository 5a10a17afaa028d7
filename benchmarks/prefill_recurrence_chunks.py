"""A hybrid target's dense time to first token by the GatedDeltaNet recurrence's long chunk
(`kernels.gated_delta.long_chunk`, patched as `recurrence_chunks.py` does), the chunk lengths
alternating in one process on the same prompts (prefix cache off), first tokens compared:

    python benchmarks/prefill_recurrence_chunks.py --model DIR --lengths 4096,16384 --chunks 128,256

`recurrence_chunks.py` times one layer's recurrence; this times what a request waits for.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from unittest import mock

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script
from sparse_prompts import _material
from ttft_long_prompts import long_prompt, toolflash_ttft

from toolflash.cache.prefix_cache import CacheConfig
from toolflash.engine.factory import build_engine
from toolflash.kernels import gated_delta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="toolflash-tiny-qwen35")
    p.add_argument("--lengths", default="4096,16384")
    p.add_argument("--chunks", default="128,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    engine = build_engine(args.model, cache=CacheConfig(enabled=False))
    rng = random.Random(0)
    code, _ = _material(rng)
    prompts = {n: long_prompt(engine, n, rng, code)[0] for n in lengths}
    for chunk in chunks:  # warm-up: each chunk length's kernels once
        with mock.patch.object(gated_delta, "long_chunk", lambda c=chunk: c):
            toolflash_ttft(engine, prompts[lengths[0]][:1024], None, None)
    runs: dict[str, list[tuple[float, int]]] = {}
    for rep in range(args.repeats):
        for n in lengths:
            for chunk in chunks if rep % 2 == 0 else chunks[::-1]:
                with mock.patch.object(gated_delta, "long_chunk", lambda c=chunk: c):
                    ttft, _, token, _, _ = toolflash_ttft(engine, prompts[n], None, None)
                runs.setdefault(f"{n}/{chunk}", []).append((ttft, token))
                print(f"rep {rep} {n} tokens, chunk {chunk}: {ttft:.3f} s", flush=True)
                mx.clear_cache()
    medians = {k: round(statistics.median(t for t, _ in v), 4) for k, v in runs.items()}
    same = {n: len({tok for c in chunks for _, tok in runs[f"{n}/{c}"]}) == 1 for n in lengths}
    for key, median in medians.items():
        print(f"{key}: median {median:.3f} s")
    report = {
        "command": "python benchmarks/prefill_recurrence_chunks.py "
        + " ".join(argv or sys.argv[1:]),
        "model": args.model,
        "device": str(mx.default_device()),
        "ttft_s": {k: [round(t, 4) for t, _ in v] for k, v in runs.items()},
        "median_s": medians,
        "first_token_same_across_chunks": same,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
