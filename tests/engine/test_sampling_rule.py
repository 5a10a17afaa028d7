"""The speculative sampling rule on synthetic p/q, many thousand trials at once: committed
tokens follow the target's distribution exactly (next token and two tokens), for a parallel
block proposal whose q does not depend on the earlier drafted tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from toolflash.engine.sampling.rejection import one_hot, rejection_verify

from .stats import ALPHA, chi_square, shift_power

V, K, N = 6, 3, 60_000


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / x.sum(axis=-1, keepdims=True)


def tables(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Target p0 [V], p1 [V, V] (row t0), p_rest [V] for deeper rows; drafter q [K, V].
    Zeros on both sides: q proposes tokens the target never picks and misses tokens it does."""
    rng = np.random.default_rng(seed)
    p0 = _normalise(rng.uniform(0.2, 1.0, V) * np.array([1, 1, 1, 1, 1, 0]))
    p1 = _normalise(rng.uniform(0.2, 1.0, (V, V)) * (rng.uniform(size=(V, V)) > 0.2))
    p_rest = _normalise(rng.uniform(0.2, 1.0, V))
    q = _normalise(rng.uniform(0.0, 1.0, (K, V)) * np.array([0, 1, 1, 1, 1, 1]))
    return p0, p1, p_rest, q


def first_cycle(
    p0: np.ndarray,
    p1: np.ndarray,
    p_rest: np.ndarray,
    q: np.ndarray,
    seed: int,
    residual_bug: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Run one cycle over N trials; returns (accepted [N], committed tokens [N, K+1] padded)."""
    keys = mx.random.split(mx.random.key(seed), 3)
    qa = mx.array(q.astype(np.float32))
    draft = mx.random.categorical(mx.log(mx.broadcast_to(qa, (N, K, V))), key=keys[0])
    d = np.array(draft).astype(np.int64)
    rows = [np.broadcast_to(p0, (N, V)), p1[d[:, 0]]] + [np.broadcast_to(p_rest, (N, V))] * (K - 1)
    p = mx.array(np.stack(rows, axis=1).astype(np.float32))
    qb = mx.broadcast_to(qa, (N, K, V))
    accepted, token = rejection_verify(draft, qb, p, keys[1], keys[2])
    if residual_bug:  # a classic mistake: resample from p instead of max(0, p - q)
        p_row = mx.take_along_axis(p, accepted[:, None, None], axis=-2)[:, 0, :]
        token = mx.random.categorical(mx.log(p_row), key=keys[2])
    a, t = np.array(accepted), np.array(token).astype(np.int64)
    out = np.full((N, K + 1), -1)
    for i in range(K + 1):
        out[:, i] = np.where(a > i, d[:, min(i, K - 1)], np.where(a == i, t, -1))
    return a, out


def two_tokens(p0, p1, p_rest, q, seed: int, residual_bug: bool = False) -> np.ndarray:
    """First two committed tokens [N, 2]; trials whose cycle committed one token run a second
    cycle from their new prefix (as the session would)."""
    _, out = first_cycle(p0, p1, p_rest, q, seed, residual_bug)
    need = out[:, 1] < 0
    if need.any():
        t0 = out[:, 0]
        keys = mx.random.split(mx.random.key(seed + 1), 3)
        qa = mx.broadcast_to(mx.array(q.astype(np.float32)), (N, K, V))
        draft = mx.random.categorical(mx.log(qa), key=keys[0])
        rows = [p1[t0]] + [np.broadcast_to(p_rest, (N, V))] * K
        p = mx.array(np.stack(rows, axis=1).astype(np.float32))
        accepted, token = rejection_verify(draft, qa, p, keys[1], keys[2])
        second = np.where(np.array(accepted) > 0, np.array(draft)[:, 0], np.array(token))
        second = second.astype(np.int64)
        out[need, 1] = second[need]
    return out[:, :2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_next_and_two_token_distributions_are_the_targets(seed: int) -> None:
    p0, p1, p_rest, q = tables(seed)
    pair = two_tokens(p0, p1, p_rest, q, seed)
    joint = p0[:, None] * p1
    first = np.bincount(pair[:, 0], minlength=V)
    pairs = np.bincount(pair[:, 0] * V + pair[:, 1], minlength=V * V)
    assert shift_power(p0, N) > 0.99 and shift_power(joint, N) > 0.9
    p_first, _ = chi_square(first, p0)
    p_pair, _ = chi_square(pairs, joint)
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


def test_the_chi_square_check_catches_a_wrong_residual() -> None:
    """The same check fails for the classic bug (resampling from p after a rejection)."""
    p0, p1, p_rest, q = tables(0)
    pair = two_tokens(p0, p1, p_rest, q, 0, residual_bug=True)
    p_first, _ = chi_square(np.bincount(pair[:, 0], minlength=V), p0)
    assert p_first < ALPHA


def test_one_hot_proposal_accepts_with_the_targets_probability() -> None:
    """Greedy or constraint-forced drafts: q is one-hot, d is kept with probability p(d)."""
    rng = np.random.default_rng(5)
    p = _normalise(rng.uniform(0.1, 1.0, (K + 1, V)))
    draft = mx.array([2, 3, 1])
    q = one_hot(draft, V)
    n = 20_000
    keys = mx.random.split(mx.random.key(9), 2)
    accepted, token = rejection_verify(
        mx.broadcast_to(draft, (n, K)),
        mx.broadcast_to(q, (n, K, V)),
        mx.broadcast_to(mx.array(p.astype(np.float32)), (n, K + 1, V)),
        keys[0],
        keys[1],
    )
    a, t = np.array(accepted), np.array(token).astype(np.int64)
    assert abs((a >= 1).mean() - p[0, 2]) < 4 * np.sqrt(p[0, 2] * (1 - p[0, 2]) / n)
    # after rejecting d at position 0 the replacement is p0 without d, renormalised
    rejected = t[a == 0]
    residual = p[0].copy()
    residual[2] = 0
    pval, _ = chi_square(np.bincount(rejected, minlength=V), residual)
    assert pval > ALPHA


def test_allowed_caps_acceptance() -> None:
    """A constraint that refuses the drafted token at position 1 (its p row gives it no mass)."""
    p = np.full((K + 1, V), 1.0 / V)
    p[1] = _normalise(np.array([1.0, 1.0, 1.0, 0.0, 1.0, 1.0]))
    draft = mx.array([2, 3, 1])
    accepted, token = rejection_verify(
        draft,
        one_hot(draft, V),
        mx.array(p.astype(np.float32)),
        mx.random.key(0),
        mx.random.key(1),
        allowed=1,
    )
    assert int(accepted.item()) <= 1
    assert int(token.item()) != 3 or int(accepted.item()) == 0
