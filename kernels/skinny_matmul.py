"""`x @ w.T` for a few rows (2-16 tokens) on MLX's CUDA backend, reading the weight once.

A batched decode step hands every linear layer a handful of rows (one token per running
request). MLX's CUDA matmul runs one row as a matrix-vector kernel that reads the weight at
memory speed, and from two rows on hands cuBLASLt a GEMM that costs about twice as much per
call in a forward's chain of dependent layers (`benchmarks/skinny_matmul.py` on an H200), so
four batched rows cost ~2x one row's step where the weight read should cost the same.

`skinny_matmul` is that matrix-vector kernel widened to R rows: each warp streams P rows of
the weight once and accumulates all R rows of `x` against each, so the weight is read once for
the whole batch. Every output element is summed in exactly the order of MLX's own
matrix-vector kernel (lane l takes columns 4l..4l+3 of every 128, float accumulation, one warp
reduction), so a row computed in a batch is bitwise the row computed alone: batching does not
change a greedy token through the linear layers.

`reference_skinny_matmul` is the plain `x @ w.T`; `skinny_matmul_supported` says when the
kernel applies (CUDA, bf16/fp16, 2-16 rows, K a multiple of 128).
"""

from __future__ import annotations

import os
from typing import Any

import mlx.core as mx

MAX_ROWS = 16  # beyond this a GEMM's tiles are full enough (and accumulators spill)
_COLS_PER_LANE = 4  # MLX's gemv: n_per_thread 4 when K % 128 == 0
_WARPS_PER_BLOCK = 8  # MLX's gemv: rows_per_block 8

_HEADER = """
#include <cooperative_groups/reduce.h>

template <typename T, int N>
struct alignas(sizeof(T) * N) SkinnyVec {
  T v[N];
};
"""

# One warp per P weight rows; lane l reads columns [4l, 4l + 4) of every 128, as MLX's gemv.
_SOURCE = """
    auto block = cg::this_thread_block();
    auto warp = cg::tiled_partition<32>(block);
    const int n_rows = x_shape[0];
    const int K = w_shape[1];
    const int N = w_shape[0];
    const int first = (block.group_index().x * block.dim_threads().y + block.thread_index().y) * P;
    const int lane = warp.thread_rank();
    using V = SkinnyVec<T, 4>;
    float sums[MAX_R][P];
#pragma unroll
    for (int r = 0; r < MAX_R; ++r) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        sums[r][p] = 0.0f;
      }
    }
    if (first < N) {
      int col = 4 * lane;
      // U chunks' weight loads in flight at once; their sums still added chunk by chunk.
      for (; col + 128 * (U - 1) < K; col += 128 * U) {
        V wv[U][P];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int p = 0; p < P; ++p) {
            int n = min(first + p, N - 1);
            wv[u][p] = *reinterpret_cast<const V*>(w + (size_t)n * K + col + 128 * u);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int r = 0; r < MAX_R; ++r) {
            if (r < n_rows) {
              V xv = *reinterpret_cast<const V*>(x + (size_t)r * K + col + 128 * u);
#pragma unroll
              for (int p = 0; p < P; ++p) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                  sums[r][p] += static_cast<float>(wv[u][p].v[j]) * static_cast<float>(xv.v[j]);
                }
              }
            }
          }
        }
      }
      for (; col < K; col += 128) {
        V wv[P];
#pragma unroll
        for (int p = 0; p < P; ++p) {
          int n = min(first + p, N - 1);
          wv[p] = *reinterpret_cast<const V*>(w + (size_t)n * K + col);
        }
#pragma unroll
        for (int r = 0; r < MAX_R; ++r) {
          if (r < n_rows) {
            V xv = *reinterpret_cast<const V*>(x + (size_t)r * K + col);
#pragma unroll
            for (int p = 0; p < P; ++p) {
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                sums[r][p] += static_cast<float>(wv[p].v[j]) * static_cast<float>(xv.v[j]);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < MAX_R; ++r) {
      if (r < n_rows) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          float s = cg::reduce(warp, sums[r][p], cg::plus<float>());
          if (lane == 0 && first + p < N) {
            y[(size_t)r * N + first + p] = static_cast<T>(s);
          }
        }
      }
    }
"""

_kernel: Any = None


def _get_kernel() -> Any:
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(
            name="toolflash_skinny_matmul",
            input_names=["x", "w"],
            output_names=["y"],
            source=_SOURCE,
            header=_HEADER,
        )
    return _kernel


def cuda_backend() -> bool:
    """Whether MLX runs on its CUDA backend (the kernel's only home)."""
    return bool(mx.default_device() == mx.gpu and mx.cuda.is_available())


def skinny_matmul_enabled() -> bool:
    """Whether targets' linear layers use `skinny_matmul` for a few rows: on the CUDA
    backend, unless TOOLFLASH_SKINNY_MATMUL=0."""
    if os.environ.get("TOOLFLASH_SKINNY_MATMUL", "1") == "0":
        return False
    return cuda_backend()


def skinny_matmul_supported(rows: int, k: int, dtype: mx.Dtype) -> bool:
    """Whether `skinny_matmul` computes `x [rows, k] @ w.T` (the caller knows the backend)."""
    return 2 <= rows <= MAX_ROWS and k % 128 == 0 and dtype in (mx.bfloat16, mx.float16)


def reference_skinny_matmul(x: mx.array, w: mx.array) -> mx.array:
    return x @ w.T


def skinny_matmul(
    x: mx.array, w: mx.array, weight_rows_per_warp: int = 1, unroll: int = 4
) -> mx.array:
    """`x [R, K] @ w[N, K].T` on the CUDA backend, for `skinny_matmul_supported` inputs."""
    rows, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or w.dtype != x.dtype:
        raise ValueError(f"skinny_matmul: x {x.shape} {x.dtype} against w {w.shape} {w.dtype}")
    max_rows = 8 if rows <= 8 else MAX_ROWS
    warps = -(-n // weight_rows_per_warp)
    return _get_kernel()(
        inputs=[x, w],
        template=[("T", x.dtype), ("MAX_R", max_rows), ("P", weight_rows_per_warp), ("U", unroll)],
        grid=(32 * -(-warps // _WARPS_PER_BLOCK), _WARPS_PER_BLOCK, 1),
        threadgroup=(32, _WARPS_PER_BLOCK, 1),
        output_shapes=[(rows, n)],
        output_dtypes=[x.dtype],
    )[0]
