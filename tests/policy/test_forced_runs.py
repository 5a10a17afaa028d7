"""Grammar-forced cycles (`CycleRecord.forced`) in the estimates: they never feed the drafter's tau or
a block's cycle time, and they count for the spec arm at their measured share of its tokens (AR
jump-forward runs are learned separately, see test_ar_forced_accounting.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolflash.engine.api import CycleRecord
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig
from toolflash.policy.estimates import Estimates
from toolflash.policy.request_class import RequestClass

from .fakes import FakeClock, ar_record, spec_record

FORCED_CLASS = RequestClass(
    kind="tool-forced", thinking="off", after_tool_result=False, length_band="lt1k"
)


def forced_record(index: int, run: int, seconds: float, ctx: int = 300) -> CycleRecord:
    """A forced run of `run` tokens verified in one forward (the target's token after it too)."""
    return CycleRecord(
        index=index,
        mode="spec",
        block_size=run + 1,
        drafted=run,
        accepted=run,
        committed=run + 1,
        draft_s=0.0,
        verify_s=seconds,
        rollback_s=0.0,
        context_len=ctx,
        forced=run,
    )


def test_forced_share_mixes_seconds_per_token() -> None:
    est = Estimates(sample_half_life=1e9, half_life_s=0, clock=FakeClock())
    for _ in range(10):
        # Drafted: 2 tokens per 10 ms (200 tok/s); forced: 7 tokens per 5 ms.
        est.observe_spec("m", "c", "json", 8, 1, 0.010, 300)
        est.observe_spec("m", "c", "json", 8, 1, 0.010, 300)
        est.observe_forced("m", "c", "json", 7, 0.005, block_size=8)
    assert est.forced_share("m", "c", "json") == pytest.approx(7 / 11)
    spec, tau = est.spec("m", "c", "json", 8, 300)
    assert tau == pytest.approx(2.0)  # the drafter's own tau, forced runs left out
    spt = (4 / 11) * (0.010 / 2) + (7 / 11) * (0.005 / 7)
    assert spec.tps == pytest.approx(1 / spt)
    assert 0 < spec.std < spec.tps
    # Another class, or a span with nothing forced, is unchanged.
    est.observe_spec("m", "c", "text", 8, 1, 0.010, 300)
    assert est.spec("m", "c", "text", 8, 300)[0].tps == pytest.approx(200.0)


def test_forced_runs_measured_at_a_larger_block_take_more_cycles_at_a_smaller_one() -> None:
    est = Estimates(sample_half_life=1e9, half_life_s=0, clock=FakeClock())
    for _ in range(10):
        est.observe_spec("m", "c", "json", 8, 1, 0.010, 300, block_sizes=(4,))
        est.observe_spec("m", "c", "json", 4, 1, 0.010, 300)
        est.observe_forced("m", "c", "json", 8, 0.005, block_size=8)  # runs of 7 + 1 at block 8
    phi = est.forced_share("m", "c", "json")
    at8 = est.spec("m", "c", "json", 8, 300)[0].tps
    at4 = est.spec("m", "c", "json", 4, 300)[0].tps
    assert at8 == pytest.approx(1 / ((1 - phi) * 0.005 + phi * 0.005 / 8))
    assert at4 == pytest.approx(1 / ((1 - phi) * 0.005 + phi * 0.005 * 2 / 8))


def test_state_files_from_before_forced_runs_still_load() -> None:
    old = Estimates(clock=FakeClock())
    old.observe_spec("m", "c", "json", 8, 3, 0.01, 300)
    doc = {k: v for k, v in old.to_json().items() if k in ("tau", "cycle_s", "ar_s")}
    est = Estimates(clock=FakeClock())
    assert est.load_json(doc) == 4
    assert est.forced_share("m", "c", "json") == 0.0
    assert est.spec("m", "c", "json", 8, 300)[0].tps == pytest.approx(400.0)


def test_controller_credits_forced_cycles_to_the_spec_arm(tmp_path: Path) -> None:
    """Drafted cycles alone (200 tok/s) lose to AR (250 tok/s), but a third of the cycles are
    forced runs that commit 7 tokens in 5 ms: spec delivers 440 tok/s and the policy keeps it."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "estimates: {timing: cycle}\nexploration: {budget_per_request: 0}\n"
        "defaults: {block_sizes: [8]}\n"
    )
    pol = AdaptivePolicy(PolicyConfig([cfg]), clock=FakeClock(), state_file=str(tmp_path / "s"))
    ctrl = pol.controller_for("m", FORCED_CLASS, False)
    decision = ctrl.start(300, 8)
    assert (decision.mode, decision.block_size) == ("spec", 8)
    for i in range(12):
        ctrl.after_step(ar_record(i, 0.004), [0], "")
    i = 12
    for _ in range(20):
        for rec in (
            forced_record(i, 6, 0.005),
            spec_record(i + 1, 8, 1, 0.010),
            spec_record(i + 2, 8, 1, 0.010),
        ):
            decision = ctrl.after_step(rec, [0] * rec.committed, "")
        i += 3
        assert decision.mode == "spec"
    span = ctrl.spans.kind
    ctrl.apply_observations()
    est = pol.model("m").estimates
    label = FORCED_CLASS.label
    # Forced cycles kept out of tau and the block's cycle time ...
    assert est.measured_tau("m", label, span, 8) == pytest.approx(2.0)
    assert max(s.mean for s in est.cycle_s.values()) == pytest.approx(0.010)
    # ... and credited to the spec arm at their share.
    assert est.forced_share("m", label, span) == pytest.approx(7 / 11, rel=0.01)  # decayed
    spec = est.spec("m", label, span, 8, 300)[0]
    assert spec.tps == pytest.approx(440.0, rel=0.01)
    # A new request of the class starts in spec on that estimate.
    nxt = pol.controller_for("m", FORCED_CLASS, False).start(300, 8)
    assert nxt.mode == "spec" and "fastest known spec8" in nxt.reason


def test_a_draft_the_grammar_cut_counts_for_tau_at_the_arms_block(tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text("estimates: {timing: cycle}\nexploration: {budget_per_request: 0}\n")
    pol = AdaptivePolicy(PolicyConfig([cfg]), clock=FakeClock(), state_file=str(tmp_path / "s"))
    ctrl = pol.controller_for("m", FORCED_CLASS, False)
    assert ctrl.start(300, 16).block_size == 16
    # Asked for 16, the grammar allowed 8 draft tokens (the call closed), all accepted.
    cut = CycleRecord(0, "spec", 9, 8, 8, 9, 0.002, 0.004, 0.0, 300, draft_cut=True)
    ctrl.after_step(cut, [0] * 9, "")
    ctrl.apply_observations()
    est = pol.model("m").estimates
    span = ctrl.spans.kind
    assert est.measured_tau("m", FORCED_CLASS.label, span, 16) == pytest.approx(9.0)
    assert est.measured_tau("m", FORCED_CLASS.label, span, 4) == pytest.approx(4.0)
    assert not est.cycle_s  # a shorter block's time is no measure of block 16
    # A block cut by max_tokens (no draft_cut) and accepted whole says only "at least 3":
    # left out (one whose draft missed inside it counts, see test_controller).
    ctrl.after_step(CycleRecord(1, "spec", 3, 2, 2, 3, 0.001, 0.002, 0.0, 309), [0] * 3, "")
    ctrl.apply_observations()
    assert est.tau[("m", FORCED_CLASS.label, span, 16)].count == 1


def test_forced_runs_are_learned_per_arm_block() -> None:
    # A 20-token forced stretch: at block 16 a forced cycle commits 16 (15 + 1), at block 8 it
    # commits 8. Runs cut at 8 must not stand in for 16's (16 takes 2 forwards, 8 takes 3).
    est = Estimates(sample_half_life=1e9, half_life_s=0, clock=FakeClock())
    for _ in range(10):
        for block in (8, 16):
            est.observe_spec("m", "c", "tool_call", block, 1, 0.010, 300)
        est.observe_forced("m", "c", "tool_call", 8, 0.005, block_size=8)
    at8 = est.spec("m", "c", "tool_call", 8, 300)[0].tps
    # 16 has no runs of its own yet: it borrows 8's (the least cut measured), as before.
    assert est.spec("m", "c", "tool_call", 16, 300)[0].tps == pytest.approx(at8)
    for _ in range(10):
        est.observe_forced("m", "c", "tool_call", 16, 0.006, block_size=16)
    phi = est.forced_share("m", "c", "tool_call")
    at16 = est.spec("m", "c", "tool_call", 16, 300)[0].tps
    assert at16 == pytest.approx(1 / ((1 - phi) * 0.005 + phi * 0.006 / 16))
    assert at16 > est.spec("m", "c", "tool_call", 8, 300)[0].tps
    # Block 4 (unmeasured) borrows 16's runs, cut to 4: four forwards per run of 16.
    est.observe_spec("m", "c", "tool_call", 4, 1, 0.010, 300)
    at4 = est.spec("m", "c", "tool_call", 4, 300)[0].tps
    phi = est.forced_share("m", "c", "tool_call")
    assert at4 == pytest.approx(1 / ((1 - phi) * 0.005 + phi * 0.006 * 4 / 16))
    # A spec run without its arm's block is refused (it would be filed under AR's runs).
    with pytest.raises(ValueError):
        est.observe_forced("m", "c", "tool_call", 8, 0.005)


def test_per_scope_forced_tables_of_older_state_files_are_ignored() -> None:
    doc = Estimates(clock=FakeClock()).to_json()
    doc["forced_s"] = [["m", "c", "json", 1.0, 0.005, 0.0, 1.0, 0.0]]
    doc["forced_n"] = [["m", "c", "json", 1.0, 8.0, 64.0, 1.0, 0.0]]
    est = Estimates(clock=FakeClock())
    est.load_json(doc)
    assert est._forced_runs(("m", "c", "json"), 8) is None
