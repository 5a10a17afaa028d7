"""A batch's padding: what the memory budget counts for rows padded to the longest, and the
verify rollback cutting off padding every row has in common once it fills a buffer step."""

from __future__ import annotations

import os

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from toolflash.engine.batching.memory import (
    KV_STEP,
    MemoryBudget,
    SequenceCost,
    default_budget_bytes,
    memory_bytes,
)
from toolflash.engine.batching.verify import rollback_rows
from toolflash.engine.targets.base import ForwardResult

COST = SequenceCost(per_token=100, fixed=7)


def test_a_batch_costs_each_row_as_much_as_the_longest() -> None:
    assert COST.batch_bytes([]) == 0
    assert COST.batch_bytes([300]) == COST.bytes_for(300)
    long, short = 3000, 50
    both = COST.batch_bytes([short, long])
    assert both == 2 * COST.bytes_for(long + KV_STEP)
    assert both > COST.bytes_for(long) + COST.bytes_for(short)


def test_the_budget_counts_the_gpus_memory_where_there_is_one() -> None:
    # What mx.device_info() reports: a CUDA GPU, Apple silicon, a CPU.
    h200 = {"device_name": "NVIDIA H200", "total_memory": 150_000_000_000, "free_memory": 1}
    metal = {"memory_size": 64 << 30, "max_recommended_working_set_size": 48 << 30}
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory_bytes(h200) == 150_000_000_000
    assert memory_bytes(metal) == 48 << 30
    assert memory_bytes({"architecture": "x86_64", "device_name": "AMD EPYC"}) == ram
    assert default_budget_bytes(16 << 30, memory_bytes(h200)) == 75_000_000_000 - (16 << 30)
    assert default_budget_bytes(16 << 30, 8 << 30) == 64 << 20  # never below a floor


def test_a_short_request_waits_beside_a_long_one_when_padding_would_not_fit() -> None:
    long, short = 3000, 50
    # Room for both by their own lengths, not for two rows padded to the long one.
    budget = MemoryBudget(COST, COST.bytes_for(long) + COST.bytes_for(short) + KV_STEP * 100)
    assert budget.fits(long)
    budget.reserve("long", long)
    assert budget.used == COST.bytes_for(long)
    assert not budget.fits(short) and budget.ever_fits(short)
    budget.release("long")
    assert budget.fits(short) and budget.used == 0
    roomy = MemoryBudget(COST, COST.batch_bytes([long, short]))
    roomy.reserve("long", long)
    assert roomy.fits(short)


def _batch(length: int, left_padding: list[int]) -> BatchKVCache:
    """Two rows of `length` slots; slot t of row b holds the value 1000 * b + t."""
    cache = BatchKVCache([0, 0])
    slots = mx.arange(length, dtype=mx.float32)
    keys = mx.stack([slots, slots + 1000])[:, None, :, None]  # [B, heads, T, dim]
    cache.update_and_fetch(keys, keys)
    keys_, values, offset, _, idx = cache.state
    pad = mx.array(left_padding)
    cache.state = (keys_, values, offset - pad, pad, idx)
    return cache


def _rows(cache: BatchKVCache) -> list[list[float]]:
    """Each row's unpadded slots, in order."""
    keys, _ = cache.keys_and_values()
    pads = cache.left_padding.tolist()
    return [keys[b, 0, pads[b] :, 0].tolist() for b in range(2)]


def test_verify_rollback_cuts_common_padding_once_it_fills_a_step() -> None:
    fed = 16
    # Row 1 keeps 10 fewer tokens: padding 250 / 270, in common 250: kept.
    cache = _batch(600, [250, 260])
    before = _rows(cache)
    rollback_rows([cache], ForwardResult(mx.zeros((2, fed, 1)), None, fed), [16, 6])
    assert cache.left_padding.tolist() == [250, 270] and cache.state[4] == 600
    assert _rows(cache) == [before[0], before[1][: len(before[1]) - 10]]
    # Row 0 keeps 10 fewer now: padding 260 / 270, 260 in common: cut off.
    before = _rows(cache)
    rollback_rows([cache], ForwardResult(mx.zeros((2, fed, 1)), None, fed), [6, 16])
    assert cache.left_padding.tolist() == [0, 10]
    assert cache.state[4] == 600 - 260
    assert _rows(cache) == [before[0][: len(before[0]) - 10], before[1]]
    # Positions (RoPE offsets) are each row's own, untouched by the cut.
    assert cache.offset.tolist() == [600 - 260 - 0, 600 - 260 - 10]
