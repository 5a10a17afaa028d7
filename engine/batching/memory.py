"""Memory per sequence in the batch, counted against a budget so admission never runs the
machine out of memory.

A sequence holds, per attention layer, keys and values for every token (prompt + output), and
per GatedDeltaNet layer a fixed recurrent and convolution state. Admission reserves the worst
case (the prompt plus all of `max_tokens`), so what was admitted always fits.

In a batch every row is as long as the longest (mlx-lm's batch caches left-pad the shorter
rows), and a batched verify's uneven rollbacks add padding of their own, cut off in common once
it reaches a buffer step (`verify.rollback_rows`). So a batch of B sequences costs B times its
longest sequence plus a step, not the sum of their own lengths: a short request beside a long
agent prompt costs as much as the long one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlx.utils import tree_flatten

from ..targets.base import TargetAdapter

# Key/value buffers grow in steps of this many tokens (mlx-lm's KVCache.step).
KV_STEP = 256


@dataclass(frozen=True)
class SequenceCost:
    """Bytes a sequence needs: `per_token` for each token it holds, `fixed` regardless."""

    per_token: int
    fixed: int

    def bytes_for(self, tokens: int) -> int:
        padded = -(-tokens // KV_STEP) * KV_STEP
        return self.per_token * padded + self.fixed

    def batch_bytes(self, tokens: Sequence[int]) -> int:
        """Bytes of sequences of `tokens` each held together: one alone is its own size; two
        or more are rows of one batch, each padded to the longest plus the padding a verify
        may leave (less than a step)."""
        if len(tokens) <= 1:
            return sum(self.bytes_for(t) for t in tokens)
        return len(tokens) * self.bytes_for(max(tokens) + KV_STEP)


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


def memory_bytes(device_info: dict[str, Any]) -> int:
    """The memory sequences share: a GPU's own (what `mx.device_info()` reports: CUDA's
    `total_memory`, on Apple silicon the working set Metal recommends), else the machine's
    RAM (a CPU reports no size)."""
    for key in ("max_recommended_working_set_size", "total_memory", "memory_size"):
        if int(device_info.get(key, 0) or 0) > 0:
            return int(device_info[key])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf: a modest 8 GiB machine
        return 8 << 30


def default_budget_bytes(weights_bytes: int, total_bytes: int) -> int:
    """Half of `total_bytes` (`memory_bytes`), less the weights: the rest stays for the
    process, MLX's buffers and the prefix cache."""
    return max(total_bytes // 2 - weights_bytes, 64 << 20)


class MemoryBudget:
    """The admitted sequences' worst-case tokens, held as one batch, against `limit` bytes."""

    def __init__(self, cost: SequenceCost, limit: int) -> None:
        self.cost = cost
        self.limit = limit
        self.reserved: dict[object, int] = {}  # key -> tokens

    @property
    def used(self) -> int:
        return self.cost.batch_bytes(list(self.reserved.values()))

    def fits(self, tokens: int) -> bool:
        """Whether a sequence of `tokens` fits beside the admitted ones now."""
        return self.cost.batch_bytes([*self.reserved.values(), tokens]) <= self.limit

    def ever_fits(self, tokens: int) -> bool:
        """Whether it fits at all (alone)."""
        return self.cost.bytes_for(tokens) <= self.limit

    def reserve(self, key: object, tokens: int) -> None:
        self.reserved[key] = tokens

    def release(self, key: object) -> None:
        self.reserved.pop(key, None)
