"""What the hybrid target's GatedDeltaNet recurrence costs by chunk length: one layer of a shape
over a long input (prefill), timed alone on MLX's default device.

    python benchmarks/recurrence_chunks.py --shape qwen3.5-9b --tokens 4096 --chunks 16,32,64,128

Each chunk length runs `--repeats` rounds, each one warm-up call and `--calls` timed calls (the
state and every output evaluated): ms per call. `gated_delta.long_chunk` picks the length per
device from these figures (benchmarks/results/README.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from unittest import mock

import mlx.core as mx
from cycle_costs import SHAPES
from script_env import ensure_optimized_blas_for_script

from toolflash.kernels import gated_delta


def inputs(shape: dict, tokens: int, dtype: mx.Dtype) -> tuple[mx.array, ...]:
    """Random q, k (unit norm), v, decays, betas and a zero state of the shape's heads."""
    hk, hv = shape["lin_k_heads"], shape["lin_v_heads"]
    dk, dv = shape["lin_k_dim"], shape["lin_v_dim"]
    keys = mx.random.split(mx.random.key(0), 5)
    q = mx.random.normal((1, tokens, hk, dk), key=keys[0]) * 0.1
    k = mx.random.normal((1, tokens, hk, dk), key=keys[1])
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((1, tokens, hv, dv), key=keys[2])
    g = mx.exp(-mx.random.uniform(shape=(1, tokens, hv), key=keys[3]) * 0.5)
    beta = mx.sigmoid(mx.random.normal((1, tokens, hv), key=keys[4]))
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    return q, k, v, g, beta, mx.zeros((1, hv, dv, dk))


def call_ms(args: tuple[mx.array, ...], calls: int) -> float:
    y, states = gated_delta.recurrence_chunked(*args, False)
    mx.eval(y, states[-1])
    t0 = time.perf_counter()
    for _ in range(calls):
        y, states = gated_delta.recurrence_chunked(*args, False)
        mx.eval(y, states[-1])
    return (time.perf_counter() - t0) / calls * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    hybrids = sorted(n for n, s in SHAPES.items() if s["family"] == "qwen3_5")
    p.add_argument("--shape", default="qwen3.5-9b", choices=hybrids)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--chunks", default="16,32,64,128")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="q, k, v (default: the engine's, float32 on the CPU, bfloat16 on a GPU)",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    dtype_name = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    data = inputs(SHAPES[args.shape], args.tokens, getattr(mx, dtype_name))
    mx.eval(*data)
    chunks = [int(c) for c in args.chunks.split(",")]
    ms: dict[int, list[float]] = {c: [] for c in chunks}
    for _ in range(args.repeats):
        for c in chunks:
            with mock.patch.object(gated_delta, "long_chunk", lambda c=c: c):
                ms[c].append(round(call_ms(data, args.calls), 2))
    for c in chunks:
        print(f"chunk {c:4d}: {' / '.join(f'{x:.1f}' for x in ms[c])} ms a layer")
    if args.json:
        report = {
            "benchmark": "recurrence_chunks",
            "shape": args.shape,
            "tokens": args.tokens,
            "device": str(mx.default_device()),
            "dtype": dtype_name,
            "default_chunk": gated_delta.long_chunk(),
            "ms_per_layer": {str(c): v for c, v in ms.items()},
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
