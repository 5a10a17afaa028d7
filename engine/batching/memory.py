"""Memory per sequence in the batch, counted against a budget so admission never runs the
machine out of memory.

A sequence holds, per attention layer, keys and values for every token (prompt + output), and
per GatedDeltaNet layer a fixed recurrent and convolution state. `sequence_bytes` reserves the
worst case at admission (the prompt plus all of `max_tokens`), so what was admitted always fits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mlx.utils import tree_flatten

from ..targets.base import TargetAdapter

# Key/value buffers grow in steps of this many tokens (mlx-lm's KVCache.step), and a batch
# row is padded up to the longest row.
_KV_STEP = 256


@dataclass(frozen=True)
class SequenceCost:
    """Bytes a sequence needs: `per_token` for each token it holds, `fixed` regardless."""

    per_token: int
    fixed: int

    def bytes_for(self, tokens: int) -> int:
        padded = -(-tokens // _KV_STEP) * _KV_STEP
        return self.per_token * padded + self.fixed


def sequence_cost(target: TargetAdapter) -> SequenceCost:
    """Read off the target's layers: K/V projections' widths for attention layers, the
    recurrent and convolution state shapes for GatedDeltaNet layers (float32 state)."""
    per_token = 0
    fixed = 0
    layers: list[Any] = list(getattr(target, "layers", []))
    for layer in layers:
        linear = getattr(layer, "linear_attn", None)
        if getattr(layer, "is_linear", False) and linear is not None:
            width = linear.in_proj_qkv.weight.dtype.size
            fixed += (linear.conv_kernel_size - 1) * linear.conv_dim * width
            fixed += linear.num_v_heads * linear.head_v_dim * linear.head_k_dim * 4
            continue
        attn = layer.self_attn
        size = attn.k_proj.weight.dtype.size
        per_token += (attn.k_proj.weight.shape[0] + attn.v_proj.weight.shape[0]) * size
    return SequenceCost(per_token, fixed)


def weights_bytes(model: Any) -> int:
    """Bytes of a model's parameters."""
    leaves: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return sum(int(v.nbytes) for _, v in leaves)


def default_budget_bytes(weights_bytes: int) -> int:
    """Half the machine's memory, less the weights: the rest stays for the process, MLX's
    buffers and the prefix cache."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf: a modest 8 GiB machine
        total = 8 << 30
    return max(total // 2 - weights_bytes, 64 << 20)


class MemoryBudget:
    """Bytes reserved by the admitted sequences, against `limit`."""

    def __init__(self, cost: SequenceCost, limit: int) -> None:
        self.cost = cost
        self.limit = limit
        self.reserved: dict[object, int] = {}

    @property
    def used(self) -> int:
        return sum(self.reserved.values())

    def need(self, tokens: int) -> int:
        return self.cost.bytes_for(tokens)

    def fits(self, tokens: int) -> bool:
        """Whether a sequence of `tokens` fits beside the admitted ones now."""
        return self.used + self.need(tokens) <= self.limit

    def ever_fits(self, tokens: int) -> bool:
        """Whether it fits at all (alone)."""
        return self.need(tokens) <= self.limit

    def reserve(self, key: object, tokens: int) -> None:
        self.reserved[key] = self.need(tokens)

    def release(self, key: object) -> None:
        self.reserved.pop(key, None)
