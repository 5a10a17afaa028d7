"""Exploration: exponential backoff after losing probes, and when a probe is worth it."""

from __future__ import annotations

from toolflash.policy.decide import p_better, probe_reason
from toolflash.policy.estimates import UNKNOWN, Throughput
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
