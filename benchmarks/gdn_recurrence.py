"""The GatedDeltaNet recurrence alone: the chunked closed form against the step-by-step
reference, at real head shapes, for one token (AR), a verify block and a prefill chunk.

Random inputs shaped as a Qwen3.5 layer makes them (unit-norm keys, decays in (0, 1)); each
case is timed after a warm-up, both implementations side by side in one process, and the
outputs are compared. Per layer: multiply by the model's GatedDeltaNet layer count (24 of 32
in Qwen3.5-9B) for a forward's share.

    python benchmarks/gdn_recurrence.py --shapes qwen3.5-9b,tiny-hybrid --tokens 1,16,512
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script

from toolflash.kernels import gated_delta

# (key heads, value heads, key dim, value dim) of the GatedDeltaNet layers.
SHAPES = {
    "tiny-hybrid": (2, 4, 32, 64),
    "qwen3.5-4b": (16, 32, 128, 128),
    "qwen3.5-9b": (16, 32, 128, 128),
    "qwen3.5-27b": (16, 48, 128, 128),
}
IMPLS = {"ops": gated_delta.recurrence_ops, "chunked": gated_delta.recurrence_chunked}


def inputs(t: int, hk: int, hv: int, dk: int, dv: int, dtype: mx.Dtype) -> list[mx.array]:
    q = mx.random.normal((1, t, hk, dk))
    k = mx.random.normal((1, t, hk, dk))
    q = (q / mx.linalg.norm(q, axis=-1, keepdims=True) * dk**-0.5).astype(dtype)
    k = (k / mx.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype)
    v = mx.random.normal((1, t, hv, dv)).astype(dtype)
    g = mx.random.uniform(0.3, 1.0, (1, t, hv))
    beta = mx.random.uniform(0.0, 1.0, (1, t, hv)).astype(dtype)
    s0 = mx.random.normal((1, hv, dv, dk)) * 0.1
    arrays = [q, k, v, g, beta, s0]
    mx.eval(arrays)
    return arrays


def time_ms(fn: Any, repeats: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return 1000 * statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default="tiny-hybrid")
    p.add_argument("--tokens", default="1,16,512", help="comma-separated T")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--json", dest="json_out", default=None)
    args = p.parse_args()
    dtype = getattr(mx, args.dtype)
    rows = []
    for name in args.shapes.split(","):
        hk, hv, dk, dv = SHAPES[name]
        for t in (int(x) for x in args.tokens.split(",")):
            arrays = inputs(t, hk, hv, dk, dv, dtype)
            keep = t <= 16  # verify blocks keep every state; prefill only the last
            row: dict[str, Any] = {"shape": name, "tokens": t, "keep_states": keep}
            outs = {}
            for impl, fn in IMPLS.items():
                outs[impl] = fn(*arrays, keep)

                def run(fn: Any = fn, arrays: list[mx.array] = arrays, keep: bool = keep) -> None:
                    y, states = fn(*arrays, keep)
                    # As the engine uses them: the output, the cache's state and the one
                    # state a rollback keeps (half the block accepted).
                    mx.eval(y, states[-1], states[len(states) // 2])

                row[f"{impl}_ms"] = time_ms(run, args.repeats)
            y_ops, y_chunked = outs["ops"][0], outs["chunked"][0]
            row["max_abs_diff"] = mx.abs(y_ops.astype(mx.float32) - y_chunked).max().item()
            row["speedup"] = row["ops_ms"] / row["chunked_ms"]
            rows.append(row)
            print(
                f"{name:<12} T={t:<5} ops {row['ops_ms']:8.3f} ms  chunked "
                f"{row['chunked_ms']:8.3f} ms  ({row['speedup']:.2f}x)  max|dy| "
                f"{row['max_abs_diff']:.1e}",
                flush=True,
            )
    if args.json_out:
        report = {"device": str(mx.default_device()), "dtype": args.dtype, "rows": rows}
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
