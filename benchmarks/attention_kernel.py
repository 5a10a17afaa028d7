"""toolflash's CPU attention kernel vs MLX's fused `scaled_dot_product_attention`, per layer, at
the shapes decoding meets: an AR step (1 query), a 16-token verify and a 512-token prefill chunk
over a long context (4 query heads, 2 KV heads, head dim 64, float32).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \\
        python benchmarks/attention_kernel.py [--context 9000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import mlx.core as mx

from toolflash.kernels.attention import attention


def fused(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: str | None) -> mx.array:
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def median_ms(fn: Callable[..., mx.array], *args: object, runs: int = 7) -> float:
    mx.eval(fn(*args))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        mx.eval(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[runs // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--context", type=int, default=9000)
    args = p.parse_args()
    print(f"{'queries':>7} {'keys':>6} {'MLX fused ms':>12} {'toolflash ms':>12} {'speedup':>7}")
    for n_q in (1, 16, 512):
        keys = mx.random.split(mx.random.key(n_q), 3)
        q = mx.random.normal((1, 4, n_q, 64), key=keys[0])
        k = mx.random.normal((1, 2, args.context, 64), key=keys[1])
        v = mx.random.normal((1, 2, args.context, 64), key=keys[2])
        mask = "causal" if n_q > 1 else None
        base = median_ms(fused, q, k, v, 0.125, mask)
        ours = median_ms(attention, q, k, v, 0.125, mask)
        print(f"{n_q:>7} {args.context:>6} {base:>12.2f} {ours:>12.2f} {base / ours:>6.2f}x")


if __name__ == "__main__":
    main()
