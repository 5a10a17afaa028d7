"""How a decode step's matmuls cost with the batch's rows: `x [B, K] @ W.T` for one weight
of a target's shape, for B in `--rows` (a batched AR step is B rows; a verify is B x block),
against B = 1, independent and chained. On a GPU one row reads the weight at memory speed (a matrix-vector kernel);
if a few rows cost much more than one, batched decode is bound by the matmul kernel, not by
toolflash's scheduler.

`--kernel` times toolflash's `skinny_matmul` (the weight read once for 2-16 rows) beside MLX's
matmul for each of `--shapes` (K x N; default a Qwen3-8B layer's and its lm_head), and checks it:
every row bitwise equal to that row's matmul alone, and its distance from a float32 product.

    python benchmarks/skinny_matmul.py [--k 4096 --n 12288 --dtype bfloat16]
    python benchmarks/skinny_matmul.py --kernel [--shapes 4096x4096,...] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from toolflash.kernels.skinny_matmul import MAX_ROWS, skinny_matmul

MatMul = Callable[[mx.array, mx.array], mx.array]
QWEN3_8B_SHAPES = "4096x4096,4096x12288,12288x4096,4096x151936"


def matmul(x: mx.array, w: mx.array) -> mx.array:
    return x @ w.T


def per_call_ms(x: mx.array, w: mx.array, calls: int = 50, op: MatMul = matmul) -> float:
    for _ in range(5):
        mx.eval(op(x, w))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        mx.eval([op(x, w) for _ in range(calls)])  # independent: the device queue stays full
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def chain_ms(x: mx.array, w: mx.array, calls: int = 50, op: MatMul = matmul) -> float:
    """Dependent matmuls (each reads the last one's output), as a forward's layers are."""

    def run() -> mx.array:
        y = x
        for _ in range(calls):
            y = op(y, w)
        return y

    for _ in range(3):
        mx.eval(run())
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        mx.eval(run())
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def kernel_rows(shapes: str, rows: list[int], dtype: mx.Dtype) -> list[dict]:
    """`skinny_matmul` against MLX's matmul per shape and row count: time, chained time
    (a [K, K] weight), bitwise agreement with each row alone, distance from float32."""
    out = []
    for shape in shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        w = (mx.random.normal((n, k)) * k**-0.5).astype(dtype)
        square = (mx.random.normal((k, k)) * k**-0.5).astype(dtype)
        for b in rows:
            if not 2 <= b <= MAX_ROWS:
                continue
            x = mx.random.normal((b, k)).astype(dtype)
            y = skinny_matmul(x, w, unroll=8)
            alone = mx.concatenate([x[r : r + 1] @ w.T for r in range(b)])
            exact = x.astype(mx.float32) @ w.astype(mx.float32).T
            row = {
                "k": k,
                "n": n,
                "rows": b,
                "rows_bitwise_equal_alone": int(mx.all(y == alone, axis=1).sum().item()),
                "max_abs_err_vs_f32": round(mx.abs(y.astype(mx.float32) - exact).max().item(), 5),
                "matmul_err_vs_f32": round(
                    mx.abs((x @ w.T).astype(mx.float32) - exact).max().item(), 5
                ),
                "one_row_ms": round(per_call_ms(x[:1], w), 4),
                "matmul_ms": round(per_call_ms(x, w), 4),
                "chain_one_row_ms": round(chain_ms(x[:1], square), 4),
                "chain_matmul_ms": round(chain_ms(x, square), 4),
            }
            for p, u in ((1, 1), (1, 4), (2, 4), (1, 8), (2, 8)):

                def op(a: mx.array, v: mx.array, p: int = p, u: int = u) -> mx.array:
                    return skinny_matmul(a, v, weight_rows_per_warp=p, unroll=u)

                row[f"kernel_p{p}u{u}_ms"] = round(per_call_ms(x, w, op=op), 4)
                row[f"chain_kernel_p{p}u{u}_ms"] = round(chain_ms(x, square, op=op), 4)
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kernel", action="store_true")
    p.add_argument("--shapes", default=QWEN3_8B_SHAPES)
    p.add_argument("--json", type=Path)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=12288)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rows", default="1,2,3,4,8,16,32,64,128")
    a = p.parse_args()
    if a.kernel:
        rows = kernel_rows(a.shapes, [int(r) for r in a.rows.split(",")], getattr(mx, a.dtype))
        if a.json:
            a.json.write_text(json.dumps({"device": str(mx.default_device()), "rows": rows}))
        return
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
    main()
