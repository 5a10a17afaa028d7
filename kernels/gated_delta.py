"""GatedDeltaNet recurrence for decode-time forwards (AR steps and verify blocks).

The verify forward of a hybrid target must be able to roll its recurrent state back to any
accepted position. The reference implementation here is a plain MLX-ops loop that keeps the
state after every step (the "tape"), so rollback is an index, not a replay. A fused Metal/CUDA
kernel can replace `recurrence` behind `set_backend` as long as it returns the same states.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

RecurrenceFn = Callable[
    [mx.array, mx.array, mx.array, mx.array, mx.array, mx.array, bool],
    tuple[mx.array, list[mx.array]],
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
    hk, hv = q.shape[2], v.shape[2]
    if hv > hk:
        q = mx.repeat(q, hv // hk, axis=2)
        k = mx.repeat(k, hv // hk, axis=2)
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


_backend: RecurrenceFn = recurrence_ops


def set_backend(fn: RecurrenceFn | None) -> None:
    """Swap the recurrence implementation (None restores the ops reference)."""
    global _backend
    _backend = fn or recurrence_ops


def recurrence(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    keep_states: bool,
) -> tuple[mx.array, list[mx.array]]:
    """Dispatch to the active implementation (ops reference unless a kernel was installed)."""
    return _backend(q, k, v, g, beta, state, keep_states)
