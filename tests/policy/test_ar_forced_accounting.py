"""AR steps that took a grammar-forced run ("jump-forward": several tokens in one forward) are
accounted per committed token: they stay out of the one-token AR step time, and the AR arm's
throughput mixes them in at their measured share of AR tokens, as the spec arm does its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolflash.engine.api import CycleRecord
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig
from toolflash.policy.estimates import Estimates

from .fakes import FakeClock, ar_record
from .test_forced_runs import FORCED_CLASS


def ar_jump(index: int, run: int, committed: int, seconds: float, ctx: int = 300) -> CycleRecord:
    """An AR step that fed a forced run of `run` tokens and committed `committed` tokens."""
    return CycleRecord(
        index=index,
        mode="ar",
        block_size=run + 1,
        drafted=0,
        accepted=0,
        committed=committed,
        draft_s=0.0,
        verify_s=seconds,
        rollback_s=0.0,
        context_len=ctx,
        forced=run,
    )


def test_estimates_mix_ar_forced_runs_per_token() -> None:
    est = Estimates(clock=FakeClock())
    for _ in range(10):
        # Two one-token steps of 4 ms (250 tok/s), one jump of 7 tokens in 5 ms.
        est.observe_ar("m", 0.004, 300, ("m", "c", "json"))
        est.observe_ar("m", 0.004, 300, ("m", "c", "json"))
        est.observe_forced("m", "c", "json", 7, 0.005, "ar")
    assert est.ar_forced_share("m", "c", "json") == pytest.approx(7 / 9, rel=0.02)
    assert est.forced_share("m", "c", "json") == 0.0  # the spec arm's share is its own
    assert est.ar("m", 300).tps == pytest.approx(250.0)  # one-token steps only
    phi = est.ar_forced_share("m", "c", "json")
    mixed = est.ar("m", 300, "c", "json")
    assert mixed.tps == pytest.approx(1.0 / ((1 - phi) * 0.004 + phi * 0.005 / 7))
    assert mixed.tps == pytest.approx(9 / 0.013, rel=0.02)
    # Another class or span: no forced runs measured, plain AR.
    assert est.ar("m", 300, "c", "text").tps == pytest.approx(250.0)
    # The surplus compares against the mixed AR figure.
    assert est.surplus("m", "c", "json", 8, 300).ar.tps == pytest.approx(mixed.tps)


def test_state_round_trip_keeps_the_ar_share() -> None:
    est = Estimates(clock=FakeClock())
    est.observe_ar("m", 0.004, 300, ("m", "c", "json"))
    est.observe_forced("m", "c", "json", 5, 0.005, "ar")
    copy = Estimates(clock=FakeClock())
    copy.load_json(est.to_json())
    assert copy.ar_forced_share("m", "c", "json") == est.ar_forced_share("m", "c", "json") > 0


def test_controller_counts_every_token_of_an_ar_jump(tmp_path: Path) -> None:
    """A jump of 7 tokens in 5 ms is not one slow AR step: the AR step time stays 4 ms and the
    AR arm in this span is credited with its jumps (9 tokens per 13 ms, ~690 tok/s)."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text("estimates: {timing: cycle}\nexploration: {budget_per_request: 0}\n")
    pol = AdaptivePolicy(PolicyConfig([cfg]), clock=FakeClock(), state_file=str(tmp_path / "s"))
    ctrl = pol.controller_for("m", FORCED_CLASS, False)
    ctrl.start(300, 8)
    i = 0
    for _ in range(15):
        for rec in (ar_record(i, 0.004), ar_record(i + 1, 0.004), ar_jump(i + 2, 6, 7, 0.005)):
            ctrl.after_step(rec, [0] * rec.committed, "")
        i += 3
    ctrl.apply_observations()  # what finish (or the next fresh read) adds
    est = pol.model("m").estimates
    span = ctrl.spans.kind
    label = FORCED_CLASS.label
    assert max(s.mean for s in est.ar_s.values()) == pytest.approx(0.004)
    assert est.ar_forced_share("m", label, span) == pytest.approx(7 / 9, rel=0.02)
    assert est.forced_share("m", label, span) == 0.0
    assert est.ar("m", 300, label, span).tps == pytest.approx(9 / 0.013, rel=0.02)
