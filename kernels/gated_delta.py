"""GatedDeltaNet recurrence for hybrid targets: prefill chunks, AR steps and verify blocks.

The verify forward of a hybrid target must be able to roll its recurrent state back to any
accepted position, so the recurrence can return the state after every step (the "tape") and
rollback is an index, not a replay.

Two implementations return the same values:
- `recurrence_ops`, the reference: one step at a time, a loop of small MLX ops per token
  (mlx-lm's own ops path). A 16-token verify is 16 dependent steps per GatedDeltaNet layer.
- `recurrence_chunked`, the default for more than one token: the chunkwise form of the gated
  delta rule (the "WY" form of DeltaNet's chunked training kernels), a handful of batched
  matmuls per chunk (`chunk_length`: a verify block is one, prefill takes 32 tokens at a
  time on the CPU, 256 on a GPU); each step's state is one more matmul, built lazily, so a
  rollback computes only the state it keeps.

A fused Metal/CUDA kernel can replace `recurrence` behind `set_backend` as long as it returns
the same states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import overload

import mlx.core as mx

RecurrenceFn = Callable[
    [mx.array, mx.array, mx.array, mx.array, mx.array, mx.array, bool],
    tuple[mx.array, Sequence[mx.array]],
]


@mx.compile
def _step(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One step: q,k [B,H,Dk]; v [B,H,Dv]; g, beta [B,H]; state [B,H,Dv,Dk] (float32)."""
    state = state * g[..., None, None]
    kv_mem = (state * k[..., None, :]).sum(axis=-1)
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., None, :] * delta[..., None]
    y = (state * q[..., None, :]).sum(axis=-1)
    return y.astype(q.dtype), state


def _expand_heads(q: mx.array, k: mx.array, hv: int) -> tuple[mx.array, mx.array]:
    """Repeat the Hk query/key heads [B,T,Hk,D] to the Hv value heads (grouped heads)."""
    hk = q.shape[2]
    if hv > hk:
        q = mx.repeat(q, hv // hk, axis=2)
        k = mx.repeat(k, hv // hk, axis=2)
    return q, k


def recurrence_ops(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    keep_states: bool,
) -> tuple[mx.array, list[mx.array]]:
    """Gated delta rule over T steps. q,k [B,T,Hk,Dk]; v [B,T,Hv,Dv]; g, beta [B,T,Hv];
    state [B,Hv,Dv,Dk]. Returns y [B,T,Hv,Dv] and the states after each step when
    `keep_states` (else only the final state)."""
    q, k = _expand_heads(q, k, v.shape[2])
    ys = []
    states = []
    for t in range(q.shape[1]):
        y, state = _step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        ys.append(y)
        if keep_states:
            states.append(state)
    if not keep_states:
        states.append(state)
    return mx.stack(ys, axis=1), states


# Tokens per closed-form chunk: a verify block (at most CHUNK) is one; longer inputs (prefill)
# loop over longer chunks, by device. Fewer chunks are fewer dependent steps of a dozen small
# kernels each, which a GPU launches at more cost than their work; a long chunk costs C^2 terms
# and merges of CHUNK blocks (`_unit_lower_inverse`), which the CPU pays in compute. Chosen by
# `benchmarks/recurrence_chunks.py` (a hybrid 9B layer on an H100: 256 ~7x faster than 16; on
# the CPU 32 and 64 tie, and the shorter keeps float32 closer to the step-by-step rule).
CHUNK = 16
LONG_CHUNK_CPU = 32
LONG_CHUNK_GPU = 256


def chunk_length(tokens: int, long_chunk: int) -> int:
    """Tokens per chunk for a forward of `tokens`: one chunk up to `long_chunk` tokens."""
    return min(tokens, long_chunk) if tokens > CHUNK else tokens


def long_chunk() -> int:
    """The chunk length of long inputs on MLX's default device."""
    return LONG_CHUNK_GPU if mx.default_device() == mx.gpu else LONG_CHUNK_CPU


def recurrence_chunked(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    keep_states: bool,
) -> tuple[mx.array, Sequence[mx.array]]:
    """The gated delta rule over T steps in chunks (`chunk_length`), same shapes and results as
    `recurrence_ops` (up to float32 rounding). One token falls back to the step. With
    `keep_states` the states are a `StepStates`: each is built when it is read."""
    if q.shape[1] == 1:
        return recurrence_ops(q, k, v, g, beta, state, keep_states)
    q, k = _expand_heads(q, k, v.shape[2])
    # Heads first, float32 throughout (the state is float32).
    qh, kh, vh = (x.transpose(0, 2, 1, 3).astype(mx.float32) for x in (q, k, v))
    gh, bh = (x.transpose(0, 2, 1).astype(mx.float32) for x in (g, beta))
    ys: list[mx.array] = []
    states = StepStates()
    size = chunk_length(qh.shape[2], long_chunk())
    for c0 in range(0, qh.shape[2], size):
        c1 = min(c0 + size, qh.shape[2])
        y, state_after = _chunk(
            qh[:, :, c0:c1],
            kh[:, :, c0:c1],
            vh[:, :, c0:c1],
            gh[..., c0:c1],
            bh[..., c0:c1],
            state,
        )
        ys.append(y)
        state = states.add(state_after, c1 - c0)  # the next chunk starts from it
    y = ys[0] if len(ys) == 1 else mx.concatenate(ys, axis=2)
    return y.transpose(0, 2, 1, 3).astype(q.dtype), states if keep_states else [state]


class StepStates(Sequence[mx.array]):
    """The recurrent state after each step of a forward, each built (a lazy MLX expression)
    only when read. A verify block's rollback reads the state it keeps and the cache the
    last one, so the block's other states cost neither compute nor the Python time of
    building their graphs (~25 us each, 15 per GatedDeltaNet layer and cycle)."""

    def __init__(self) -> None:
        self._chunks: list[tuple[Callable[[int], mx.array], int]] = []
        self._len = 0
        self._built: dict[int, mx.array] = {}

    def add(self, state_after: Callable[[int], mx.array], count: int) -> mx.array:
        """Append a chunk of `count` steps (`state_after(t)`, t < count, builds the state
        after its step t); returns the chunk's last state."""
        self._chunks.append((state_after, count))
        self._len += count
        return self[self._len - 1]

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> mx.array: ...

    @overload
    def __getitem__(self, index: slice) -> list[mx.array]: ...

    def __getitem__(self, index: int | slice) -> mx.array | list[mx.array]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError(index)
        if i not in self._built:
            t = i
            for state_after, count in self._chunks:
                if t < count:
                    self._built[i] = state_after(t)
                    break
                t -= count
        return self._built[i]


def _chunk(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    s0: mx.array,
) -> tuple[mx.array, Callable[[int], mx.array]]:
    """One chunk in closed form. q,k [B,H,C,Dk]; v [B,H,C,Dv]; g, beta [B,H,C]; s0 [B,H,Dv,Dk].

    With G_t = g_1...g_t, the step S_t = g_t S_{t-1} + u_t k_t^T (u_t the step's delta)
    unrolls to S_t = G_t S_0 + sum_{j<=t} (G_t/G_j) u_j k_j^T, so the deltas solve one unit
    lower-triangular system (I + A) U = beta * (V - G * K S_0^T), A_tj = beta_t (G_t/G_j)
    k_t.k_j for j < t, and y_t = S_t q_t needs no loop. Returns y [B,H,C,Dv] and a function
    building the state after step t (lazy: only the states used are computed)."""
    y, u, decay, gain = _chunk_core(q, k, v, g, beta, s0)

    def state_after(t: int) -> mx.array:
        # S_t = G_t S_0 + sum_{j<=t} (G_t/G_j) u_j k_j^T: one [Dv, t+1] x [t+1, Dk] matmul.
        weights = decay[..., t, : t + 1, None]  # G_t / G_j
        return (
            gain[:, :, t][..., None] * s0
            + (u[..., : t + 1, :] * weights).swapaxes(-1, -2) @ k[..., : t + 1, :]
        )

    return y, state_after


@mx.compile
def _chunk_core(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, s0: mx.array
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """The chunk's outputs y, deltas u, decays G_t/G_j (j <= t, else 0) and gains G_t,
    compiled so the elementwise work fuses (one graph per chunk length)."""
    c = q.shape[2]
    # log G, floored so a decay that underflowed to 0 stays finite (its products stay ~0).
    log_g = mx.cumsum(mx.log(mx.maximum(g, 1e-30)), axis=-1)
    steps = mx.arange(c)
    upto = steps[:, None] >= steps[None, :]  # j <= t
    before = steps[:, None] > steps[None, :]  # j < t
    diff = log_g[..., :, None] - log_g[..., None, :]
    decay = mx.where(upto, mx.exp(mx.where(upto, diff, 0.0)), 0.0)  # G_t / G_j, j <= t
    gain = mx.exp(log_g)[..., None]  # G_t
    s0_t = s0.swapaxes(-1, -2)  # [B,H,Dk,Dv]
    a = mx.where(before, decay, 0.0) * (k @ k.swapaxes(-1, -2)) * beta[..., None]
    rhs = beta[..., None] * (v - gain * (k @ s0_t))
    u = _unit_lower_inverse(a) @ rhs
    y = gain * (q @ s0_t) + (decay * (q @ k.swapaxes(-1, -2))) @ u
    return y, u, decay, gain


def _series_inverse(a: mx.array) -> mx.array:
    """(I + A)^-1 for strictly lower-triangular A: A is nilpotent, so the inverse is the
    finite series I - A + A^2 - ..., which the product (I - A)(I + A^2)(I + A^4)... reaches in
    log2(C) matmul pairs (no triangular solver, which MLX only has on the CPU). Its terms grow
    like binomials in C before they cancel, so it is exact in float32 only for small blocks."""
    c = a.shape[-1]
    eye = mx.eye(c, dtype=a.dtype)
    inverse = eye - a
    power, reach = a, 2
    while reach < c:
        power = power @ power
        inverse = inverse @ (eye + power)
        reach *= 2
    return inverse


def _unit_lower_inverse(a: mx.array) -> mx.array:
    """(I + A)^-1 for strictly lower-triangular A [..., C, C]. Up to CHUNK the series; longer,
    the series on diagonal blocks of CHUNK, merged pairwise into blocks twice as long with
    [[L11, 0], [L21, L22]]^-1 = [[L11^-1, 0], [-L22^-1 L21 L11^-1, L22^-1]], which only
    multiplies inverses (bounded: the delta rule contracts) and never forms a long series.
    (The series over 32 tokens of one repeated key already overflows float32.)"""
    c = a.shape[-1]
    if c <= CHUNK:
        return _series_inverse(a)
    size = CHUNK
    while size < c:
        size *= 2
    lead = a.shape[:-2]
    if size > c:  # zero rows and columns: identity blocks that the merges carry along
        a = mx.pad(a, [(0, 0)] * len(lead) + [(0, size - c), (0, size - c)])
    block = CHUNK
    m = size // block
    grid = a.reshape(*lead, m, block, m, block)
    # [..., m, b, b]: the diagonal blocks' inverses.
    inv = _series_inverse(mx.moveaxis(mx.diagonal(grid, 0, -4, -2), -1, -3))
    while block < size:
        # The blocks just below the diagonal, pair by pair: L21 of each merged block.
        below = mx.moveaxis(mx.diagonal(grid, -1, -4, -2), -1, -3)[..., ::2, :, :]
        first, second = inv[..., ::2, :, :], inv[..., 1::2, :, :]
        corner = -(second @ below @ first)
        zeros = mx.zeros_like(first)
        inv = mx.concatenate(
            [mx.concatenate([first, zeros], -1), mx.concatenate([corner, second], -1)], -2
        )
        block *= 2
        m //= 2
        grid = a.reshape(*lead, m, block, m, block)
    inverse = inv[..., 0, :, :]
    return inverse[..., :c, :c]


_backend: RecurrenceFn = recurrence_chunked


def set_backend(fn: RecurrenceFn | None) -> None:
    """Swap the recurrence implementation (None restores the default, the chunked form)."""
    global _backend
    _backend = fn or recurrence_chunked


def recurrence(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    keep_states: bool,
) -> tuple[mx.array, Sequence[mx.array]]:
    """Dispatch to the active implementation (the chunked form unless one was installed)."""
    return _backend(q, k, v, g, beta, state, keep_states)
