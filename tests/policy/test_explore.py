"""Exploration: exponential backoff after losing probes, and when a probe is worth it."""

from __future__ import annotations

from toolflash.policy.decide import p_better, probe_reason
from toolflash.policy.throughput import UNKNOWN, Throughput
from toolflash.policy.trial import probe_backoff

SCOPE = ("m", "chat.think-off.user.lt1k", "text")


def test_backoff_doubles_per_loss_up_to_the_cap_and_resets_on_a_win() -> None:
    b = probe_backoff(base_steps=8, max_steps=40)
    arm = ("ar", 1)
    assert b.allowed(SCOPE, arm)
    waits = [b.lost(SCOPE, arm) for _ in range(4)]
    assert waits == [8, 16, 32, 40]
    assert not b.allowed(SCOPE, arm)
    for _ in range(39):
        b.tick(SCOPE)
    assert not b.allowed(SCOPE, arm)
    b.tick(SCOPE)
    assert b.allowed(SCOPE, arm)
    assert b.allowed(SCOPE, ("spec", 4))  # per arm
    b.won(SCOPE, arm)
    assert b.losses(SCOPE, arm) == 0 and b.lost(SCOPE, arm) == 8


def test_probe_only_where_uncertain() -> None:
    cur = Throughput(100.0, 2.0, 50.0)
    kw = {"min_samples": 3.0, "explore_p": 0.1, "min_confidence": 0.8}
    assert probe_reason(UNKNOWN, cur, **kw) == "few-samples"
    assert probe_reason(Throughput(150.0, 40.0, 2.0), cur, **kw) == "few-samples"
    assert probe_reason(Throughput(60.0, 2.0, 50.0), cur, **kw) is None  # clearly worse
    assert probe_reason(Throughput(101.0, 5.0, 50.0), cur, **kw) == "uncertain"
    assert probe_reason(Throughput(140.0, 2.0, 50.0), cur, **kw) is None  # decisive: switch
    assert p_better(UNKNOWN, cur) == 0.5
    assert p_better(Throughput(140.0, 0.0, 9.0), Throughput(100.0, 0.0, 9.0)) == 1.0


def test_a_hopeless_class_prior_is_not_probed_but_a_pooled_one_is() -> None:
    cur = Throughput(350.0, 20.0, 8.0)
    kw = {"min_samples": 3.0, "explore_p": 0.1, "min_confidence": 0.8}
    hopeless = Throughput(200.0, 60.0, 0.0, prior="class")  # p ~ 0.01
    assert probe_reason(hopeless, cur, **kw) is None
    assert probe_reason(Throughput(200.0, 60.0, 0.0, prior="pool"), cur, **kw) == "few-samples"
    # A class prior that could still win keeps its few-samples probe.
    assert probe_reason(Throughput(330.0, 60.0, 0.0, prior="class"), cur, **kw) == "few-samples"


def test_a_class_prior_does_not_rule_out_against_a_young_arm() -> None:
    kw = {"min_samples": 3.0, "explore_p": 0.1, "min_confidence": 0.8}
    hopeless = Throughput(200.0, 60.0, 0.0, prior="class")
    # The current arm a prior itself (0 samples), or measured in one request: still probed.
    for young in (Throughput(350.0, 20.0, 0.0, prior="pool"), Throughput(350.0, 20.0, 1.0)):
        assert probe_reason(hopeless, young, **kw) == "few-samples"
        assert probe_reason(hopeless, young, **kw, prior_veto="always") is None


def test_spec_priors_say_where_they_come_from() -> None:
    from toolflash.policy.estimates import POOL, Estimates

    est = Estimates()
    model, label, span = "m", "chat.think-off.user.lt1k", "text"
    for _ in range(6):
        est.observe_spec(model, label, span, 8, accepted=1, seconds=0.01, context_len=100)
    own, _ = est.spec(model, label, span, 8, 100)
    assert own.known and own.prior == ""
    other, _ = est.spec(model, "json.think-off.user.lt1k", span, 8, 100)
    assert other.known and other.prior == "pool"
    est.prior_tau[(model, "json.think-off.user.lt1k", span, 8)] = est.tau[(model, POOL, span, 8)]
    seeded, _ = est.spec(model, "json.think-off.user.lt1k", span, 8, 100)
    assert seeded.prior == "class"
