"""An arm's first step after a request's start or a change of arm carries one-off costs (the
lookup index catching up on the prompt, the drafter on tokens it has not seen, a dropped
lookahead, the decision's own work): its tokens are learned, its time is not
(`estimates.settle_steps`), so a short probe reads the arm's per-step cost, not the switch's."""

from __future__ import annotations

from pathlib import Path

from toolflash.engine.api import CycleRecord
from toolflash.policy.config import PolicyConfig
from toolflash.policy.estimates import Estimates
from toolflash.policy.measure import observe_step
from toolflash.policy.request_class import RequestClass

from .fakes import FakeClock, ar_record, lookup_record, spec_record
from .test_controller import policy

CHAT = RequestClass(kind="chat", thinking="off", after_tool_result=False, length_band="lt1k")
LABEL = CHAT.label


def _forced_record(index: int, committed: int, seconds: float, mode: str) -> CycleRecord:
    return CycleRecord(
        index=index,
        mode=mode,
        block_size=committed if mode == "spec" else 1,
        drafted=0,
        accepted=committed - 1 if mode == "spec" else 0,
        committed=committed,
        draft_s=0.0,
        verify_s=seconds,
        rollback_s=0.0,
        context_len=300,
        forced=committed - 1,
    )


def _observe(est: Estimates, record: CycleRecord, arm: tuple[str, int], settling: bool) -> None:
    pol = PolicyConfig().for_model("m")
    observe_step(est, pol, "m", LABEL, record, "text", 0.01, arm, settling=settling)


def test_a_settling_step_teaches_tokens_not_time() -> None:
    est = Estimates(clock=FakeClock())
    scope = ("m", LABEL, "text")
    # A spec cycle: its tau is learned (this and the smaller blocks), its cycle time is not.
    _observe(est, spec_record(0, 8, 5, 0.05), ("spec", 8), True)
    assert est.tau[(*scope, 8)].mean == 6.0 and est.tau[(*scope, 4)].mean == 4.0
    assert not est.cycle_s and not est.cycle_scope_s
    # An AR step: its token counts for the AR forced share, its time for nothing.
    _observe(est, ar_record(1, 0.05), ("ar", 1), True)
    assert not est.ar_s and not est.ar_scope_s
    assert est.ar_tokens[scope].s1 > 0
    # A lookup step: tokens per step, not seconds.
    _observe(est, lookup_record(2, 3, 0.05), ("lookup", 8), True)
    assert est.lookup_tokens[(*scope, 8)].mean == 3.0
    assert (*scope, 8) not in est.lookup_s
    # Grammar-forced runs: their share of the tokens, not their time.
    _observe(est, _forced_record(3, 5, 0.05, "spec"), ("spec", 8), True)
    _observe(est, _forced_record(4, 5, 0.05, "ar"), ("ar", 1), True)
    assert est.forced_share(*scope) > 0 and est.ar_forced_share(*scope) > 0
    assert not est.forced_block_s
    # The same steps, not settling, are timed.
    _observe(est, spec_record(5, 8, 5, 0.05), ("spec", 8), False)
    _observe(est, ar_record(6, 0.05), ("ar", 1), False)
    _observe(est, lookup_record(7, 3, 0.05), ("lookup", 8), False)
    _observe(est, _forced_record(8, 5, 0.05, "ar"), ("ar", 1), False)
    assert est.cycle_scope_s and est.ar_scope_s and est.lookup_s and est.forced_block_s


def _run_with_switch_costs(tmp_path: Path, settle: int) -> list[str]:
    """A class measured at AR 4 ms a token, no drafter, lookup not measured yet. Lookup's steps
    commit 2 tokens in 5 ms (400 tok/s against AR's 250), but the first after each switch to
    it costs 40 ms more (the index catching up on the prompt)."""
    tmp_path.mkdir()
    pol = policy(tmp_path, f"estimates: {{settle_steps: {settle}}}\n")
    est = pol.model("m").estimates
    for _ in range(20):
        est.observe_ar("m", 0.004, 300, ("m", LABEL, "text"))
    ctrl = pol.controller_for("m", CHAT, False)
    decision = ctrl.start(300, 0, 8)
    assert decision.mode == "ar"
    previous = "ar"
    for i in range(120):
        if decision.mode == "lookup":
            switch = 0.040 if previous != "lookup" else 0.0
            record = lookup_record(i, 2, 0.005 + switch)
        else:
            record = ar_record(i, 0.004)
        previous = decision.mode
        decision = ctrl.after_step(record, [0] * record.committed, "ab"[: record.committed])
    return [d["kind"] for d in ctrl.decisions]


def test_a_probe_is_judged_by_its_steps_not_its_switch(tmp_path: Path) -> None:
    # Settling: the probe's first step is untimed, its other five read 400 tok/s: won.
    kinds = _run_with_switch_costs(tmp_path / "settle", 1)
    assert "probe" in kinds and kinds[kinds.index("probe") + 1] == "probe-won"
    # Every step timed (as before): 12 tokens in 65 ms, 185 tok/s, read as a loss.
    kinds = _run_with_switch_costs(tmp_path / "timed", 0)
    assert "probe" in kinds and kinds[kinds.index("probe") + 1] == "probe-lost"
