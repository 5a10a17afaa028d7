"""Estimator math: decayed means, time decay with a fake clock, confidence, buckets, surplus."""

from __future__ import annotations

import math

import pytest

from toolflash.policy.estimates import Estimates, Stat, context_bucket, normal_cdf

from .fakes import FakeClock


def test_context_buckets_are_powers_of_two() -> None:
    assert [context_bucket(n) for n in (1, 256, 257, 1000, 1024, 1025)] == [
        256,
        256,
        512,
        1024,
        1024,
        2048,
    ]
    assert context_bucket(3, smallest=1) == 4


def test_stat_sample_decay_weights_recent_samples_more() -> None:
    s = Stat()
    decay = 0.5  # half life of one sample
    for x in (10.0, 10.0, 10.0, 20.0):
        s.add(x, now=0.0, sample_decay=decay, half_life_s=0.0)
    # weights 1/8, 1/4, 1/2, 1 -> mean = (10*(7/8) + 20) / (15/8)
    assert s.mean == pytest.approx((10 * 7 / 8 + 20) / (15 / 8))
    assert s.weight == pytest.approx(15 / 8)
    assert s.count == 4


def test_stat_time_decay_halves_weight_per_half_life() -> None:
    s = Stat()
    s.add(4.0, now=100.0, sample_decay=1.0, half_life_s=60.0)
    s.add(4.0, now=100.0, sample_decay=1.0, half_life_s=60.0)
    assert s.effective(160.0, 60.0) == pytest.approx(1.0)
    assert s.effective(220.0, 60.0) == pytest.approx(0.5)
    s.add(8.0, now=220.0, sample_decay=1.0, half_life_s=60.0)  # old weight 0.5, new 1
    assert s.mean == pytest.approx((0.5 * 4 + 8) / 1.5)
    assert s.var == pytest.approx((0.5 * 16 + 64) / 1.5 - s.mean**2)


def test_surplus_from_tau_and_cycle_time() -> None:
    clock = FakeClock()
    est = Estimates(sample_half_life=1e9, half_life_s=0, clock=clock)
    for _ in range(20):
        est.observe_spec("m", "c", "text", 8, accepted=3, seconds=0.010, context_len=300)
        est.observe_ar("m", seconds=0.005, context_len=300)
    s = est.surplus("m", "c", "text", 8, 300)
    assert s.tau == pytest.approx(4.0)
    assert s.spec.tps == pytest.approx(400.0)
    assert s.ar.tps == pytest.approx(200.0)
    assert s.value == pytest.approx(200.0)
    assert s.p_positive > 0.99
    # Counterfactual credit: block 4 would have committed min(3, 3) + 1 = 4, block 2 would
    # have committed 2; their cycle times are unknown until measured.
    assert ("m", "c", "text", 4) not in est.tau  # not credited without block_sizes
    est.observe_spec("m", "c", "text", 8, 7, 0.010, 300, block_sizes=(8, 4, 2))
    assert est.tau[("m", "c", "text", 4)].mean == pytest.approx(4.0)
    assert est.tau[("m", "c", "text", 2)].mean == pytest.approx(2.0)
    assert not est.spec("m", "c", "text", 4, 300)[0].known


def test_confidence_grows_with_samples_and_fades_with_time() -> None:
    clock = FakeClock()
    est = Estimates(sample_half_life=1e9, half_life_s=600.0, clock=clock)
    est.observe_spec("m", "c", "tool_call", 8, 0, 0.010, 300)
    est.observe_ar("m", 0.009, 300)
    early = est.surplus("m", "c", "tool_call", 8, 300)
    for _ in range(30):
        est.observe_spec("m", "c", "tool_call", 8, 0, 0.010, 300)
        est.observe_ar("m", 0.009, 300)
    late = est.surplus("m", "c", "tool_call", 8, 300)
    assert late.value < 0 and early.value < 0
    assert late.std < early.std
    assert late.p_positive < early.p_positive < 0.5
    clock.advance(6000)  # ten half lives: the estimate is stale again
    stale = est.surplus("m", "c", "tool_call", 8, 300)
    assert stale.value == pytest.approx(late.value)
    assert stale.samples < 0.1 and stale.std > 10 * late.std


def test_unknown_and_nearest_bucket() -> None:
    est = Estimates(clock=FakeClock())
    assert not est.ar("m", 100).known
    assert est.surplus("m", "c", "text", 8, 100).p_positive == 0.5
    est.observe_ar("m", 0.01, 300)  # bucket 512
    near = est.ar("m", 3000)  # bucket 4096 borrows 512's timing
    assert near.known and near.tps == pytest.approx(100.0)
    assert not est.ar("other", 300).known


def test_normal_cdf() -> None:
    assert normal_cdf(0.0) == 0.5
    assert normal_cdf(1.96) == pytest.approx(0.975, abs=1e-3)
    assert math.isclose(normal_cdf(-1.0) + normal_cdf(1.0), 1.0)


def test_json_round_trip_and_rejects_malformed() -> None:
    clock = FakeClock()
    est = Estimates(clock=clock)
    est.observe_spec("m", "c", "json", 8, 5, 0.02, 700, block_sizes=(4,))
    est.observe_ar("m", 0.004, 700)
    copy = Estimates(clock=clock)
    # 2 blocks x 3 tau pools, cycle (the model's and the class's), AR, and the forced share's
    # two sums (nothing forced yet)
    assert copy.load_json(est.to_json()) == 11
    assert copy.surplus("m", "c", "json", 8, 700) == est.surplus("m", "c", "json", 8, 700)
    with pytest.raises(ValueError):
        Estimates().load_json({"tau": [["m", "c", "json", "8", 1, 1, 1, 1, 1]]})
    with pytest.raises(ValueError):
        Estimates().load_json({"ar_s": [["m", 512, -1, 0, 0, 1, 0]]})
    bad = Estimates()
    with pytest.raises(ValueError):
        bad.load_json({"ar_s": [["m", 512, 1, 1, 1, 1, 0]], "cycle_s": "x"})
    assert not bad.ar_s  # nothing merged from a bad document


def test_new_class_starts_from_the_pooled_prior() -> None:
    est = Estimates(sample_half_life=1e9, clock=FakeClock())
    for _ in range(50):
        est.observe_spec("m", "tools.a", "tool_call", 8, 6, 0.01, 300)
        est.observe_spec("m", "tools.a", "text", 8, 0, 0.01, 300)
    est.observe_ar("m", 0.004, 300)
    own = est.spec("m", "tools.a", "tool_call", 8, 300)[0]
    prior, tau = est.spec("m", "json.b", "tool_call", 8, 300)
    assert tau == pytest.approx(7.0)  # the tool_call pool, not the all-span pool
    assert prior.tps == pytest.approx(own.tps)
    assert prior.samples == 0 and own.samples > 10  # a prior still counts as unmeasured
    assert prior.std > own.std
    assert est.spec("m", "json.b", "reasoning", 8, 300)[1] == pytest.approx(4.0)  # all spans
    assert est.measured_tau("m", "json.b", "tool_call", 8) is None


def test_timing_bursts_are_clipped() -> None:
    est = Estimates(sample_half_life=1e9, clock=FakeClock())
    for _ in range(10):
        est.observe_ar("m", 0.010, 300)
    est.observe_ar("m", 1.0, 300)  # another process held the CPU for a second
    stat = est.ar_s[("m", 512)]
    assert stat.mean == pytest.approx((10 * 0.010 + 0.020) / 11)
    for _ in range(40):  # a lasting 3x slowdown is still followed
        est.observe_ar("m", 0.030, 300)
    assert est.ar("m", 300).tps == pytest.approx(1 / 0.030, rel=0.3)


def test_larger_block_tau_is_floored_by_a_smaller_blocks() -> None:
    # Block 8 ran many cycles at tau 4; three probe cycles at 16 happened to land on hard text
    # (tau 1.5). A larger block commits at least what a smaller one would, so 16's tau reads 4.
    clock = FakeClock()
    est = Estimates(sample_half_life=1e9, half_life_s=0, clock=clock)
    for _ in range(30):
        est.observe_spec("m", "c", "text", 8, 3, 0.010, 300, block_sizes=(16, 8, 4))
    for accepted in (0, 1, 0):
        est.observe_spec("m", "c", "text", 16, accepted, 0.012, 300, block_sizes=(16, 8, 4))
    assert est.tau[("m", "c", "text", 16)].mean == pytest.approx(4 / 3)
    tps, tau = est.spec("m", "c", "text", 16, 300)
    assert tau == pytest.approx(est.tau[("m", "c", "text", 8)].mean)
    assert tps.tps == pytest.approx(tau / 0.012)
    assert est.measured_tau("m", "c", "text", 16) == pytest.approx(tau)
    # Never lowered: where 16 measured more, its own tau stands; 4 is not floored by 8.
    for _ in range(40):
        est.observe_spec("m", "c", "text", 16, 12, 0.012, 300, block_sizes=(16, 8, 4))
    assert est.spec("m", "c", "text", 16, 300)[1] == pytest.approx(
        est.tau[("m", "c", "text", 16)].mean
    )
    assert est.measured_tau("m", "c", "text", 4) == pytest.approx(
        est.tau[("m", "c", "text", 4)].mean
    )
    # A restarted process rebuilds the floor's index from the persisted tau table.
    again = Estimates(sample_half_life=1e9, half_life_s=0, clock=clock)
    again.load_json(est.to_json())
    assert again.measured_tau("m", "c", "text", 16) == est.measured_tau("m", "c", "text", 16)


def test_pooled_priors_applied_when_read_equal_eager_updates() -> None:
    """Pooled tau priors are updated when a prior is read or the tables are saved, not on
    every cycle: a cold class reads what the others measured, as if updated at once."""
    clock = FakeClock()
    lazy, eager = Estimates(clock=clock), Estimates(clock=clock)
    for i in range(12):
        clock.t += 7.0  # the decay between observations must follow their own times
        for est in (lazy, eager):
            est.observe_spec("m", "tools", "tool_call", 16, i % 5, 0.011, 300, (8, 4))
            est.observe_ar("m", 0.004, 300)
        eager.flush_pooled()
    clock.t += 60.0
    cold = lazy.spec("m", "json", "tool_call", 16, 300)  # no own tau: reads the prior
    assert cold[0].known and cold == eager.spec("m", "json", "tool_call", 16, 300)
    assert lazy.to_json() == eager.to_json()


@pytest.mark.parametrize("scope", ["class", "model"])
def test_step_and_cycle_timings_per_class_and_span(scope: str) -> None:
    """A constrained span's steps cost more (grammar masks): with timing_scope "class" each
    (class, span) reads its own AR step and spec cycle times once measured, a class without
    its own reads the model's mix; with "model" every class reads the mix."""
    est = Estimates(sample_half_life=1e9, half_life_s=0, clock=FakeClock(), timing_scope=scope)
    for _ in range(4):
        est.observe_ar("m", 0.002, 300, ("m", "chat", "text"))
        est.observe_ar("m", 0.003, 300, ("m", "json", "json"))
        est.observe_spec("m", "chat", "text", 8, 3, 0.008, 300)
        est.observe_spec("m", "json", "json", 8, 3, 0.012, 300)
    chat = est.ar("m", 300, "chat", "text").tps
    json_ar = est.ar("m", 300, "json", "json").tps
    other = est.ar("m", 300, "tools", "text").tps
    assert other == pytest.approx(1 / 0.0025)  # the model's mix
    chat_spec = est.spec("m", "chat", "text", 8, 300)[0].tps
    json_spec = est.spec("m", "json", "json", 8, 300)[0].tps
    if scope == "class":
        assert chat == pytest.approx(500.0) and json_ar == pytest.approx(1 / 0.003)
        assert chat_spec == pytest.approx(4 / 0.008) and json_spec == pytest.approx(4 / 0.012)
    else:
        assert chat == json_ar == other
        assert chat_spec == json_spec == pytest.approx(4 / 0.010)
