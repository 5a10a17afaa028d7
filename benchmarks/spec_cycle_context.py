"""What an AR step and a speculative cycle cost as the context grows, one request alone.

    python benchmarks/spec_cycle_context.py --model DIR --draft DIR [--lengths 200,1000,3000]

For each prompt length (random ids), one warm-up generation, then `--tokens` tokens in AR and
in spec (fixed block, EOS ignored): ms per AR step and per spec cycle (between the second and
the last token events), and tokens per cycle. Each length is new to the process, as every
decode cycle's key length is to MLX's kernels: on CUDA, MLX's fused attention for more than one
query builds a cuDNN graph per new shape, which `TOOLFLASH_COMPOSED_ATTENTION=0` brings back
(kernels/attention.py, `composed_attention_enabled`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.api import GenerationRequest, TokenEvent
from toolflash.engine.factory import build_engine


def per_cycle(
    engine: object, prompt: tuple[int, ...], mode: str, tokens: int
) -> tuple[float, float]:
    """(ms per cycle or step, tokens per cycle) of one generation."""
    request = GenerationRequest(
        prompt_tokens=prompt, max_tokens=tokens, mode=mode, ignore_eos=True, draft_length="fixed"
    )
    stamps, committed = [], 0
    for event in engine.generate(request):  # type: ignore[attr-defined]
        if isinstance(event, TokenEvent):
            stamps.append(time.perf_counter())
            committed += len(event.token_ids)
    cycles = len(stamps) - 2  # the prefill's token and the first cycle are left out
    return (stamps[-1] - stamps[1]) / max(cycles, 1) * 1e3, committed / len(stamps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="toolflash-tiny-qwen35")
    p.add_argument("--draft", default=None)
    p.add_argument("--lengths", default="200,1000,3000")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    engine = build_engine(a.model, a.draft, mode="spec")
    rng = mx.random.key(0)
    warm = tuple(int(t) for t in mx.random.randint(0, 1000, (64,), key=rng).tolist())
    per_cycle(engine, warm, "ar", a.tokens)
    per_cycle(engine, warm, "spec", a.tokens)
    rows = []
    for i, length in enumerate(int(n) for n in a.lengths.split(",")):
        key = mx.random.key(i + 1)
        prompt = tuple(int(t) for t in mx.random.randint(0, 1000, (length,), key=key).tolist())
        ar_ms, _ = per_cycle(engine, prompt, "ar", a.tokens)
        spec_ms, tau = per_cycle(engine, prompt, "spec", a.tokens)
        row = {
            "prompt": length,
            "ar_step_ms": round(ar_ms, 2),
            "spec_cycle_ms": round(spec_ms, 2),
            "tokens_per_cycle": round(tau, 2),
            "cycle_in_ar_steps": round(spec_ms / ar_ms, 2),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "command": "python benchmarks/spec_cycle_context.py "
                    f"--model {a.model} --lengths {a.lengths} --tokens {a.tokens}",
                    "device": str(mx.default_device()),
                    "composed_attention": os.environ.get("TOOLFLASH_COMPOSED_ATTENTION", "1"),
                    "rows": rows,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
