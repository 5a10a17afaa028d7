"""How much a newcomer's long prompt stalls a stream that is already decoding, with and without
the batch scheduler's prefill thread (engine level, no HTTP).

    python benchmarks/prefill_stall.py --prompt-tokens 4096 --repeats 3 \
        --json benchmarks/results/prefill_stall.json

One request decodes (greedy, EOS ignored); once it has `--warm-tokens` tokens, a second
request with a `--prompt-tokens` prompt of random ids joins. While the newcomer prefills, the
running stream's inter-token gaps are recorded (largest and median) with its tokens per
second over that window, and the newcomer's time to first token. Both configurations run the
same requests, interleaved per repeat; the running stream's tokens are compared between them.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.api import GenerationRequest, TokenEvent
from toolflash.engine.batching.batcher import EngineBatcher
from toolflash.engine.factory import build_engine


def run_once(
    engine: Any, running: GenerationRequest, newcomer: GenerationRequest, warm: int, thread: bool
) -> dict[str, Any]:
    batcher = EngineBatcher(engine, 2, prefill_thread=thread)
    batcher.add("running", running)
    tokens: list[int] = []
    stamps: list[float] = []
    joined_at = first_at = None
    while batcher.size:
        if joined_at is None and len(tokens) >= warm:
            batcher.add("newcomer", newcomer)
            joined_at = time.perf_counter()
        for key, events in batcher.step():
            assert not isinstance(events, BaseException), events
            now = time.perf_counter()
            for e in events:
                if not isinstance(e, TokenEvent) or not e.token_ids:
                    continue
                if key == "running":
                    tokens.extend(e.token_ids)
                    stamps.extend([now] * len(e.token_ids))
                elif first_at is None:
                    first_at = now
    assert joined_at is not None and first_at is not None
    window = [t for t in stamps if joined_at <= t <= first_at]
    gaps = [b - a for a, b in zip(window, window[1:])] or [first_at - joined_at]
    return {
        "newcomer_ttft_ms": (first_at - joined_at) * 1e3,
        "running_max_gap_ms": max(gaps) * 1e3,
        "running_median_gap_ms": statistics.median(gaps) * 1e3,
        "running_tokens_during_prefill": len(window),
        "running_tok_s_during_prefill": len(window) / (first_at - joined_at),
        "tokens": tokens,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="toolflash-tiny-qwen35")
    p.add_argument("--prompt-tokens", type=int, default=4096)
    p.add_argument("--warm-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=1024, help="the running request's")
    p.add_argument("--mode", default="ar", help="the running request's mode")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    engine = build_engine(args.model)
    rng = random.Random(0)
    vocab = engine.target.vocab_size
    prompt = tuple(engine.encode("Write a long story about a lighthouse keeper."))
    running = GenerationRequest(prompt, args.max_tokens, mode=args.mode, ignore_eos=True)
    configs = {"prefill thread": True, "in the step": False}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for rep in range(args.repeats + 1):  # the first round warms up
        ids = tuple(rng.randrange(16, vocab) for _ in range(args.prompt_tokens))
        newcomer = GenerationRequest(ids, 4, mode="ar")  # fresh ids: no prefix-cache hit
        names = list(configs) if rep % 2 == 0 else list(reversed(configs))
        for name in names:
            result = run_once(engine, running, newcomer, args.warm_tokens, configs[name])
            if rep > 0:
                runs[name].append(result)
                print(
                    f"rep {rep} {name}: newcomer TTFT {result['newcomer_ttft_ms']:.0f} ms, "
                    f"running stream's largest gap {result['running_max_gap_ms']:.1f} ms, "
                    f"{result['running_tokens_during_prefill']} tokens meanwhile",
                    file=sys.stderr,
                    flush=True,
                )
    same = all(
        a["tokens"] == b["tokens"] for a, b in zip(runs["prefill thread"], runs["in the step"])
    )
    keys = [k for k in runs["in the step"][0] if k != "tokens"]
    rows = [
        {"config": name, **{k: round(statistics.median(r[k] for r in runs[name]), 1) for k in keys}}
        for name in configs
    ]
    report = {
        "command": "python benchmarks/prefill_stall.py " + " ".join(argv or sys.argv[1:]),
        "model": args.model,
        "device": str(mx.default_device()),
        "prompt_tokens": args.prompt_tokens,
        "prefill_chunk": engine.options.prefill_chunk,
        "running_mode": args.mode,
        "running_tokens_equal": same,
        "results": rows,
        "machine": platform.platform(),
    }
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
