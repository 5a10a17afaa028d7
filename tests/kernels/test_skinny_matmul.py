"""`skinny_matmul` (CUDA only: bitwise per row against one row alone) and the linear-layer swap
that routes a target's few-row calls to it (everywhere: same parameters, same outputs)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from toolflash.engine.targets.skinny_linear import SkinnyLinear, use_skinny_linears
from toolflash.kernels.skinny_matmul import (
    MAX_ROWS,
    cuda_backend,
    reference_skinny_matmul,
    skinny_matmul,
    skinny_matmul_supported,
)


def test_supported_rows_dtypes_and_widths() -> None:
    assert skinny_matmul_supported(2, 128, mx.bfloat16)
    assert skinny_matmul_supported(MAX_ROWS, 4096, mx.float16)
    assert not skinny_matmul_supported(1, 4096, mx.bfloat16)  # MLX's own gemv
    assert not skinny_matmul_supported(MAX_ROWS + 1, 4096, mx.bfloat16)
    assert not skinny_matmul_supported(4, 4100, mx.bfloat16)
    assert not skinny_matmul_supported(4, 4096, mx.float32)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(128, 256, bias=False)
        self.down = nn.Linear(256, 128, bias=True)
        self.norm = nn.RMSNorm(128)
        self.layers = [nn.Linear(128, 128, bias=False), nn.QuantizedLinear(128, 128)]

    def __call__(self, x: mx.array) -> mx.array:
        h = self.down(nn.silu(self.up(self.norm(x))))
        return self.layers[1](self.layers[0](h))


def test_swap_keeps_parameters_and_outputs() -> None:
    mx.random.seed(0)
    model = Block()
    before = dict(tree_flatten(model.parameters()))
    x = mx.random.normal((3, 1, 128))
    want = model(x)
    assert use_skinny_linears(model) == 3  # the quantized layer stays as it is
    assert isinstance(model.up, SkinnyLinear) and isinstance(model.layers[0], SkinnyLinear)
    assert isinstance(model.layers[1], nn.QuantizedLinear)
    after = dict(tree_flatten(model.parameters()))
    assert before.keys() == after.keys()
    assert all(after[k] is before[k] for k in before)
    assert mx.array_equal(model(x), want)  # float32 rows: plain matmul, as nn.Linear
    assert mx.array_equal(model(x[:1]), want[:1])


@pytest.mark.skipif(not cuda_backend(), reason="the kernel runs on MLX's CUDA backend only")
@pytest.mark.parametrize("rows", [2, 3, 8, 9, MAX_ROWS])
@pytest.mark.parametrize("n", [1024, 1000, 12288])
@pytest.mark.parametrize("p", [1, 2, 4])
def test_kernel_rows_equal_each_row_alone(rows: int, n: int, p: int) -> None:
    mx.random.seed(rows * n + p)
    k = 4096
    w = (mx.random.normal((n, k)) * k**-0.5).astype(mx.bfloat16)
    x = mx.random.normal((rows, k)).astype(mx.bfloat16)
    y = skinny_matmul(x, w, weight_rows_per_warp=p)
    assert y.shape == (rows, n) and y.dtype == mx.bfloat16
    for r in range(rows):  # one row alone runs MLX's gemv: same sums, same order
        assert mx.array_equal(y[r : r + 1], reference_skinny_matmul(x[r : r + 1], w)), r
    exact = x.astype(mx.float32) @ w.astype(mx.float32).T
    assert mx.allclose(y.astype(mx.float32), exact, atol=0.05, rtol=0.02)
