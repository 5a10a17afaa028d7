"""Linear layers whose few-row calls read the weight once (`kernels.skinny_matmul`).

On MLX's CUDA backend a batched decode step's linear layers see 2-16 rows, which MLX runs as
a GEMM at about twice one row's cost; `use_skinny_linears` swaps each of a model's plain
`nn.Linear` layers for a `SkinnyLinear` holding the same weight (the way `nn.quantize` swaps
layers: `update_modules`, parameter names unchanged), which runs those calls through
`skinny_matmul` and every other call exactly as `nn.Linear` does.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from toolflash.kernels.skinny_matmul import skinny_matmul, skinny_matmul_supported


class SkinnyLinear(nn.Module):
    """An `nn.Linear`'s weight (and bias) whose calls on 2-16 rows run `skinny_matmul`."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        if "bias" in linear:
            self.bias = linear.bias

    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        k = x.shape[-1]
        rows = x.size // k if k else 0
        if x.dtype == weight.dtype and skinny_matmul_supported(rows, k, x.dtype):
            y = skinny_matmul(x.reshape(rows, k), weight).reshape(*x.shape[:-1], -1)
            return y + self["bias"] if "bias" in self else y
        if "bias" in self:
            return mx.addmm(self["bias"], x, weight.T)
        return x @ weight.T


def use_skinny_linears(model: nn.Module) -> int:
    """Swap `model`'s plain `nn.Linear` layers for `SkinnyLinear`; how many were swapped."""
    swapped = 0

    def swap(_path: str, module: nn.Module) -> nn.Module:
        nonlocal swapped
        if type(module) is nn.Linear:
            swapped += 1
            return SkinnyLinear(module)
        return module

    leaves = tree_map_with_path(swap, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    return swapped
