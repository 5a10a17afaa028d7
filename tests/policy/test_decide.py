"""The policy's decisions as pure functions of a rule and a table of estimates, without a
controller: arms, choose, settled block, could-win, probe pick, verdicts."""

from __future__ import annotations

from toolflash.policy.config import SpanRule
from toolflash.policy.decide import (
    AR,
    Arm,
    arms,
    beats,
    best_block,
    choose,
    could_win,
    fmt,
    local_verdict,
    pick_probe,
    settled_block,
)
from toolflash.policy.throughput import UNKNOWN, Throughput

RULE = SpanRule("adaptive", (16, 8, 4), switch_margin=0.05, min_confidence=0.8, min_samples=3.0)
S16, S8, S4 = ("spec", 16), ("spec", 8), ("spec", 4)


def t(tps: float, std: float = 10.0, samples: float = 20.0) -> Throughput:
    return Throughput(tps, std, samples)


def test_arms_follow_the_rule_and_the_drafters_block() -> None:
    assert arms(RULE, 16) == [S16, S8, S4, AR]
    assert arms(RULE, 8) == [S8, S4, AR]
    assert arms(RULE, 2) == [("spec", 2), AR]  # no configured block fits: the drafter's
    assert arms(SpanRule("spec", (16, 8), 0.05, 0.8, 3.0), 16) == [S16, S8]
    assert arms(SpanRule("ar", (16, 8), 0.05, 0.8, 3.0), 16) == [AR]


def _choose(current: Arm | None, est: dict[Arm, Throughput], **kw: object) -> tuple[Arm, str, str]:
    allowed = arms(RULE, 16)
    full = {a: est.get(a, UNKNOWN) for a in allowed}
    return choose(RULE, "text", current, allowed, full, running=current or AR, initial_mode="spec", **{"block_precedence": "largest", **kw})  # type: ignore[arg-type]  # fmt: skip


def test_choose_starts_optimistic_then_fastest_known_and_keeps_within_the_margin() -> None:
    assert _choose(None, {}) == (S16, "text: spec not measured yet, initial spec16", "start")
    arm, reason, kind = _choose(None, {S8: t(600), AR: t(250)})
    assert (arm, kind) == (S8, "start") and reason == "text: fastest known spec8 600±10 tok/s"
    # AR 3% faster than the current spec8: within the margin, kept.
    assert _choose(S8, {S8: t(600), AR: t(618)})[0] == S8
    # AR 20% faster with confidence: switch, explained.
    arm, reason, _ = _choose(S8, {S8: t(600), AR: t(720)})
    assert arm == AR and "beats spec8" in reason
    # A forced rule has one arm.
    one = SpanRule("ar", (16,), 0.05, 0.8, 3.0)
    assert choose(
        one,
        "json",
        None,
        [AR],
        {AR: UNKNOWN},
        running=AR,
        initial_mode="spec",
        block_precedence="largest",
    ) == (
        AR,
        "json: policy mode ar",
        "forced",
    )


def test_a_cautious_start_leaves_an_uncertain_spec_estimate_for_ar() -> None:
    # A class whose requests accept whole blocks or nothing: spec's mean is high, its spread wide.
    est = {S16: t(560, 190), AR: t(430, 15)}
    assert _choose(None, est)[0] == S16  # no caution: the highest estimate
    arm, reason, kind = _choose(None, est, caution=1.0)
    assert (arm, kind) == (AR, "start") and "ar 430" in reason
    assert _choose(None, {S16: t(900, 150), AR: t(430, 15)}, caution=1.0)[0] == S16  # sure win
    # Caution is a start's only: a span already in spec keeps it within the hysteresis.
    assert _choose(S16, est, caution=1.0)[0] == S16


def test_settled_block_keeps_the_largest_unless_a_smaller_is_clearly_faster() -> None:
    est = {S16: t(600, 100), S8: t(700, 100), S4: t(400, 20)}
    assert settled_block([S16, S8, S4], est, RULE) == S16  # 8 faster, not with confidence
    est[S8], est[S16] = t(800, 20), t(600, 20)
    assert settled_block([S16, S8, S4], est, RULE) == S8
    assert best_block(RULE, [S16, S8, S4, AR], est, "largest") == 8
    assert best_block(SpanRule("ar", (16, 8), 0.05, 0.8, 3.0), [AR], {}, "largest") == 16


def test_could_win_bounds_spec_by_tau_times_ar() -> None:
    assert could_win(None, t(300), RULE)  # nothing measured: may win
    assert could_win(t(400, 0), UNKNOWN, RULE)
    assert could_win(t(400, 0), t(300), RULE)
    assert not could_win(t(310, 0), t(300), RULE)  # within the margin: hopeless


def test_probe_pick_prefers_few_samples_then_uncertainty() -> None:
    cur = t(500, 10, 50)
    est = {S8: t(510, 20, 50), S4: t(900, 50, 1), AR: t(100, 5, 50)}
    assert pick_probe([S8, S4, AR], est, cur, RULE, 0.1) == (S4, "few-samples")
    assert pick_probe([S8, AR], est, cur, RULE, 0.1) == (S8, "uncertain")
    assert pick_probe([AR], est, cur, RULE, 0.1) is None  # clearly worse: decided


def test_verdicts() -> None:
    assert beats(t(700, 10), t(500, 10), RULE) and not beats(t(510, 10), t(500, 10), RULE)
    assert not beats(UNKNOWN, t(500), RULE)
    assert local_verdict(6.0, 0.010, 250.0, 0.05) == "spec"
    assert local_verdict(1.0, 0.010, 250.0, 0.05) == "ar"
    assert local_verdict(2.5, 0.010, 250.0, 0.05) == "unsure"
    assert fmt(S8, {}) == "spec8 ?" and fmt(AR, {AR: t(250.4, 3.2)}) == "ar 250±3 tok/s"
