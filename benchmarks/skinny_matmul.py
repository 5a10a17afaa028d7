"""How a decode step's matmuls cost with the batch's rows: `x [B, K] @ W.T` for one weight
of a target's shape, for B in `--rows` (a batched AR step is B rows; a verify is B x block),
against B = 1, independent and chained. On a GPU one row reads the weight at memory speed (a matrix-vector kernel);
if a few rows cost much more than one, batched decode is bound by the matmul kernel, not by
toolflash's scheduler.

    python benchmarks/skinny_matmul.py [--k 4096 --n 12288 --dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script


def per_call_ms(x: mx.array, w: mx.array, calls: int = 50) -> float:
    for _ in range(5):
        mx.eval(x @ w.T)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        mx.eval([x @ w.T for _ in range(calls)])  # independent: the device queue stays full
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def chain_ms(x: mx.array, w: mx.array, calls: int = 50) -> float:
    """Dependent matmuls (each reads the last one's output), as a forward's layers are."""

    def run() -> mx.array:
        y = x
        for _ in range(calls):
            y = y @ w.T
        return y

    for _ in range(3):
        mx.eval(run())
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        mx.eval(run())
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=12288)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rows", default="1,2,3,4,8,16,32,64,128")
    a = p.parse_args()
    if a.n < a.k:
        raise SystemExit("--n at least --k (the chain reads a [K, K] slice of the weight)")
    dtype = getattr(mx, a.dtype)
    w = mx.random.normal((a.n, a.k)).astype(dtype)
    # The chain's weight: square, scaled so fifty products stay finite in bf16.
    square = mx.contiguous(w[: a.k, : a.k]) * (a.k**-0.5)
    base = None
    for b in [int(r) for r in a.rows.split(",")]:
        # The layouts a forward hands a linear layer: rows as tokens [B, K], a batch of B
        # one-token rows [B, 1, K] (batched decode), one row of B tokens [1, B, K] (a verify).
        for shape in ((b, a.k), (b, 1, a.k), (1, b, a.k)):
            x = mx.random.normal(shape).astype(dtype)
            ms = per_call_ms(x, w)
            base = base or ms
            gbs = w.nbytes / ms / 1e6
            dep = chain_ms(x, square)
            print(
                f"x {str(shape):16s}: {ms:.3f} ms ({gbs:.0f} GB/s of weight), "
                f"{ms / base:.2f}x one row; chained [K, K]: {dep:.3f} ms"
            )


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
