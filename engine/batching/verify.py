"""Per-row rollback after a batched verify: every row fed the same number of tokens, each keeps
its own accepted prefix.

Attention rows (`BatchKVCache`) drop what no row keeps, then each row that keeps less is rolled
right by the difference: the dropped tail wraps to the front and becomes left padding, which
the batch mask hides (mlx-lm's own `prepare(right_padding)` / `finalize` move). Padding that
every row has in common is cut off once it reaches a key/value buffer step (as mlx-lm's
`filter` does when a row leaves), so the batch holds at most the longest row plus less than a
step, however long it decodes (what `memory.batch_bytes` counts on). GatedDeltaNet
rows (`ArraysCache`) take, per row, the recurrent state after its last kept token and the
convolution window ending there, from the forward's tape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache

from ..targets.base import ForwardResult
from .memory import KV_STEP


def rollback_rows(layers: Sequence[Any], result: ForwardResult, keeps: Sequence[int]) -> None:
    """Make row i of every batched layer cache hold only the first `keeps[i]` tokens of the
    last forward `result` (run with keep_tape=True over all rows)."""
    fed = result.tokens
    most = max(keeps)
    pads = [most - k for k in keeps]
    for i, layer in enumerate(layers):
        if isinstance(layer, BatchKVCache):
            _rollback_attention(layer, fed - most, pads)
        elif isinstance(layer, ArraysCache):
            _rollback_recurrent(layer, result.tape[i], keeps, fed)
        else:
            raise TypeError(f"no per-row rollback for {type(layer).__name__}")


def _rollback_attention(cache: BatchKVCache, drop: int, pads: Sequence[int]) -> None:
    if drop > 0:
        cache.trim(drop)
    if not any(pads):
        return
    keys, values, offset, left_padding, idx = cache.state
    # The whole buffer rolls, its free tail with it: what wraps round lands in the padding,
    # and the next forward writes in place instead of growing a buffer cut at idx (a copy).
    keys, values = _roll_rows(keys, pads), _roll_rows(values, pads)
    pad = mx.array(list(pads))
    left_padding = left_padding + pad
    common = min(left_padding.tolist())  # tiny: does not wait for the roll
    if common >= KV_STEP:
        keys, values = keys[..., common:, :], values[..., common:, :]
        left_padding, idx = left_padding - common, idx - common
    cache.state = (keys, values, offset - pad, left_padding, idx)


def _roll_rows(x: mx.array, shifts: Sequence[int]) -> mx.array:
    """Row i of `x` [B, H, S, D] rolled right by shifts[i] along S: slices per row (a gather
    with per-element indices, as `dynamic_roll` takes, is ~4x slower on the CPU)."""
    rows = []
    for i, shift in enumerate(shifts):
        row = x[i : i + 1]
        if shift:
            row = mx.concatenate([row[..., -shift:, :], row[..., :-shift, :]], axis=2)
        rows.append(row)
    return mx.concatenate(rows, axis=0)


def _rollback_recurrent(cache: ArraysCache, tape: Any, keeps: Sequence[int], fed: int) -> None:
    keep = mx.array(list(keeps))
    # State after k kept tokens: the prior state for k = 0, else the state after step k - 1.
    # The tape builds a state only when read, so only the kept ones are computed.
    kept = {k: tape.prior if k == 0 else tape.states[k - 1] for k in set(keeps)}
    cache[1] = mx.stack([kept[k][row] for row, k in enumerate(keeps)])
    conv_input = tape.conv_input  # [B, K-1+T, C]: the window before the forward, then its inputs
    window = conv_input.shape[1] - fed
    index = (keep[:, None] + mx.arange(window)[None])[:, :, None]
    cache[0] = mx.take_along_axis(conv_input, index, axis=1)
