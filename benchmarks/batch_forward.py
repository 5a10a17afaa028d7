"""What one decode forward costs with B rows, in mlx-lm alone and through toolflash's target:
mlx-lm's model on its `BatchKVCache` (B = 1, 2, 4, 8; equal rows, and row 0 left-padded as a
batch with a shorter prompt is), toolflash's `forward` on the same caches, and mlx-lm's model
on a plain `KVCache` (what one request decoding alone runs).

    python benchmarks/batch_forward.py --model DIR [--context 200]

Each forward is one token per row after a `--context`-token prompt, evaluated and trimmed
back, so every call sees the same cache. If mlx-lm's own batched forward costs as much as
toolflash's, a batched step's price is the backend's (its matmul and attention kernels for a
few rows; see `benchmarks/skinny_matmul.py`), not the scheduler's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.factory import build_engine


def ms_per_call(step: Callable[[], None], calls: int = 30) -> float:
    for _ in range(3):
        step()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def one_token(
    forward: Callable[[mx.array, list[Any]], mx.array], cache: list[Any], rows: int
) -> Callable[[], None]:
    """One token per row through `forward`, evaluated, then trimmed off every cache."""
    token = mx.zeros((rows, 1), dtype=mx.int32)

    def step() -> None:
        mx.eval(forward(token, cache))
        for c in cache:
            c.trim(1)

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="toolflash-tiny-qwen3")
    p.add_argument("--rows", default="1,2,4,8")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    engine = build_engine(a.model, no_draft=True)
    target = engine.target
    model = target.model
    if any(getattr(layer, "is_linear", False) for layer in target.layers):
        raise SystemExit("attention-only targets (a recurrent layer's state cannot be trimmed)")

    def mlx_lm(tokens: mx.array, cache: list[Any]) -> mx.array:
        return model(tokens, cache=cache)

    def toolflash(tokens: mx.array, cache: list[Any]) -> mx.array:
        return target.forward(tokens, cache).logits

    rows_out = []
    for rows in [int(r) for r in a.rows.split(",")]:
        for pad in (0, 7) if rows > 1 else (0,):
            cache = [BatchKVCache([pad] + [0] * (rows - 1)) for _ in model.layers]
            mx.eval(model(mx.random.randint(0, 1000, (rows, a.context)), cache=cache))
            row = {
                "rows": rows,
                "left_pad_row0": pad,
                "mlx_lm_ms": round(ms_per_call(one_token(mlx_lm, cache, rows)), 2),
                "toolflash_ms": round(ms_per_call(one_token(toolflash, cache, rows)), 2),
            }
            rows_out.append(row)
            print(
                f"{rows} rows (row 0 padded {pad}): mlx-lm model {row['mlx_lm_ms']:.2f} ms, "
                f"toolflash forward {row['toolflash_ms']:.2f} ms",
                flush=True,
            )
    cache = [KVCache() for _ in model.layers]
    mx.eval(model(mx.random.randint(0, 1000, (1, a.context)), cache=cache))
    alone = round(ms_per_call(one_token(mlx_lm, cache, 1)), 2)
    print(f"one request's KVCache: mlx-lm model {alone:.2f} ms")
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "command": "python benchmarks/batch_forward.py "
                    f"--model {a.model} --rows {a.rows} --context {a.context}",
                    "device": str(mx.default_device()),
                    "rows": rows_out,
                    "kv_cache_one_row_ms": alone,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
