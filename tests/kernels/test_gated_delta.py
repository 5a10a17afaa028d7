"""The chunked GatedDeltaNet recurrence against the step-by-step reference."""

from __future__ import annotations

import mlx.core as mx
import pytest

from toolflash.kernels import gated_delta


def _inputs(t: int, hk: int, hv: int, dk: int, dv: int, g_low: float = 0.3, seed: int = 0):  # type: ignore[no-untyped-def]
    """Inputs shaped as a Qwen3.5 GatedDeltaNet layer makes them: unit-norm keys, queries
    scaled by dk^-0.5, decays in (0, 1], beta in (0, 1), a nonzero starting state."""
    mx.random.seed(seed)
    q = mx.random.normal((1, t, hk, dk))
    k = mx.random.normal((1, t, hk, dk))
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * dk**-0.5
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((1, t, hv, dv))
    g = mx.random.uniform(g_low, 1.0, (1, t, hv))
    beta = mx.random.uniform(0.0, 1.0, (1, t, hv))
    s0 = mx.random.normal((1, hv, dv, dk)) * 0.1
    return q, k, v, g, beta, s0


@pytest.mark.parametrize(
    "t,hk,hv,dk,dv",
    [
        (2, 1, 1, 8, 8),
        (5, 2, 2, 16, 16),
        (16, 2, 4, 32, 48),
        (37, 2, 4, 32, 32),
        (130, 1, 2, 16, 8),
        (300, 2, 2, 16, 16),
    ],
)
@pytest.mark.parametrize("keep", [True, False])
def test_chunked_matches_reference(t: int, hk: int, hv: int, dk: int, dv: int, keep: bool) -> None:
    args = _inputs(t, hk, hv, dk, dv)
    y_ref, states_ref = gated_delta.recurrence_ops(*args, keep)
    y, states = gated_delta.recurrence_chunked(*args, keep)
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    assert mx.allclose(y, y_ref, atol=1e-5).item()
    assert len(states) == len(states_ref) == (t if keep else 1)
    for got, want in zip(states, states_ref):
        assert got.shape == want.shape
        assert mx.allclose(got, want, atol=1e-5).item()


def test_a_verify_block_is_one_chunk_and_prefill_takes_long_chunks() -> None:
    assert [gated_delta.chunk_length(t, 128) for t in (2, 16)] == [2, 16]
    assert [gated_delta.chunk_length(t, 32) for t in (17, 32, 33, 4096)] == [17, 32, 32, 32]
    assert gated_delta.chunk_length(4096, 128) == 128
    assert gated_delta.long_chunk() == gated_delta.LONG_CHUNK_CPU  # the suite runs on the CPU


@pytest.mark.parametrize("chunk", [gated_delta.LONG_CHUNK_CPU, gated_delta.LONG_CHUNK_GPU])
def test_each_devices_long_chunks_match_the_reference(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gated_delta, "long_chunk", lambda: chunk)
    args = _inputs(300, 2, 4, 32, 32)
    y_ref, states_ref = gated_delta.recurrence_ops(*args, True)
    y, states = gated_delta.recurrence_chunked(*args, True)
    assert mx.allclose(y, y_ref, atol=1e-5).item()
    for t in (0, 127, 128, 299):
        assert mx.allclose(states[t], states_ref[t], atol=1e-5).item()


@pytest.mark.parametrize("chunk", [32, 64, gated_delta.LONG_CHUNK_CPU, gated_delta.LONG_CHUNK_GPU])
def test_long_chunks_stay_exact_on_a_repeated_key(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run of one token (indentation, a repeated line) repeats its key: with decays near 1
    # the chunk's system is far from the identity, and the series inverse over 32 such
    # steps overflowed float32 (NaN by 64) where the step-by-step rule stays bounded.
    monkeypatch.setattr(gated_delta, "long_chunk", lambda: chunk)
    q, k, v, _, _, s0 = _inputs(300, 2, 4, 32, 32)
    key = k[:, :1] + 0.05 * k  # one key, slightly perturbed per step
    k = key / mx.linalg.norm(key, axis=-1, keepdims=True)
    g = mx.full((1, 300, 4), 0.999)
    beta = mx.full((1, 300, 4), 0.95)
    y_ref, states_ref = gated_delta.recurrence_ops(q, k, v, g, beta, s0, True)
    y, states = gated_delta.recurrence_chunked(q, k, v, g, beta, s0, True)
    # float32 on a near-degenerate system: up to ~8e-4 at every chunk length, 16 included.
    assert mx.allclose(y, y_ref, atol=2e-3).item()
    for t in (chunk - 1, 299):
        assert mx.allclose(states[t], states_ref[t], atol=2e-3).item()


def test_chunked_survives_decays_that_underflow() -> None:
    # g == 0 wipes the state: log-space decays must not turn into 0/0.
    q, k, v, g, beta, s0 = _inputs(16, 2, 2, 16, 16)
    g = mx.where(mx.arange(16)[None, :, None] % 5 == 2, 0.0, g)
    y_ref, states_ref = gated_delta.recurrence_ops(q, k, v, g, beta, s0, True)
    y, states = gated_delta.recurrence_chunked(q, k, v, g, beta, s0, True)
    assert not mx.isnan(y).any().item()
    assert mx.allclose(y, y_ref, atol=1e-5).item()
    assert mx.allclose(states[-1], states_ref[-1], atol=1e-5).item()


def test_chunked_one_token_is_the_step() -> None:
    args = _inputs(1, 2, 4, 16, 16)
    y_ref, states_ref = gated_delta.recurrence_ops(*args, True)
    y, states = gated_delta.recurrence_chunked(*args, True)
    assert mx.array_equal(y, y_ref).item() and mx.array_equal(states[0], states_ref[0]).item()


def test_default_backend_is_chunked_and_swappable() -> None:
    args = _inputs(4, 1, 1, 8, 8)
    calls: list[int] = []

    def spy(*a):  # type: ignore[no-untyped-def]
        calls.append(1)
        return gated_delta.recurrence_ops(*a)

    gated_delta.set_backend(spy)
    try:
        gated_delta.recurrence(*args, False)
    finally:
        gated_delta.set_backend(None)
    assert calls == [1]
    y, _ = gated_delta.recurrence(*args, False)
    y_chunked, _ = gated_delta.recurrence_chunked(*args, False)
    assert mx.array_equal(y, y_chunked).item()


def test_step_states_build_only_what_is_read() -> None:
    built: list[tuple[str, int]] = []

    def chunk(name: str):  # type: ignore[no-untyped-def]
        def state_after(t: int) -> mx.array:
            built.append((name, t))
            return mx.array([t])

        return state_after

    states = gated_delta.StepStates()
    last_a = states.add(chunk("a"), 3)
    assert last_a.item() == 2 and built == [("a", 2)]
    states.add(chunk("b"), 2)
    assert len(states) == 5 and built == [("a", 2), ("b", 1)]
    assert states[1].item() == 1 and states[-2].item() == 0  # b's step 0
    assert states[2] is last_a  # built once, then reused
    assert built == [("a", 2), ("b", 1), ("a", 1), ("b", 0)]
    assert [s.item() for s in states[3:]] == [0, 1]
    with pytest.raises(IndexError):
        states[5]
    with pytest.raises(IndexError):
        states[-6]


def test_verify_tape_reads_one_state_per_rollback() -> None:
    # A 16-step chunk kept for rollback: reading one middle state equals the reference.
    args = _inputs(16, 2, 4, 32, 48)
    _, states_ref = gated_delta.recurrence_ops(*args, True)
    _, states = gated_delta.recurrence_chunked(*args, True)
    assert isinstance(states, gated_delta.StepStates)
    assert mx.allclose(states[6], states_ref[6], atol=1e-5).item()
