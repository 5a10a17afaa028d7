"""A request's own acceptance next to its class's: the verdict math, the tally, the opening
probe's backoff, and the controller using them (opening probes, request rechecks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolflash.engine.api import CycleRecord
from toolflash.policy.decide import local_verdict
from toolflash.policy.request_class import RequestClass
from toolflash.policy.request_evidence import WINDOW, RequestEvidence
from toolflash.policy.trial import opening_backoff

from .fakes import ar_record, spec_record
from .test_controller import policy as _policy


def policy(tmp_path: Path, extra: str = "") -> Any:
    """The test policy with the request's own evidence on (off by default: the engine's
    adaptive draft length handles drafts that miss)."""
    return _policy(tmp_path, extra + "decisions: {request_evidence_cycles: 3}\n")


TOOL_RESULT = RequestClass(kind="tools", thinking="off", after_tool_result=True, length_band="lt1k")
CHAT = RequestClass(kind="chat", thinking="off", after_tool_result=False, length_band="lt1k")
SCOPE = ("m", "label", "text")


def forced_record(index: int, run: int, seconds: float) -> CycleRecord:
    return CycleRecord(
        index, "spec", run + 1, run, run, run + 1, 0.0, seconds, 0.0, 300, forced=run
    )


def test_verdict_needs_the_margin_either_way() -> None:
    # 10 ms cycles vs AR at 250 tok/s: break-even tau 2.5.
    assert local_verdict(6.0, 0.010, 250.0, 0.05) == "spec"
    assert local_verdict(1.0, 0.010, 250.0, 0.05) == "ar"
    assert local_verdict(2.5, 0.010, 250.0, 0.05) == "unsure"
    assert local_verdict(2.5 * 1.05, 0.010, 250.0, 0.05) == "spec"
    assert local_verdict(3.0, 0.0, 250.0, 0.05) == "unsure"


def test_tally_counts_drafted_cycles_over_a_window() -> None:
    ev = RequestEvidence(min_cycles=3)
    ev.add("text", ar_record(0, 0.004))  # AR steps say nothing about acceptance
    ev.add("text", spec_record(1, 8, 5, 0.01))
    ev.add("text", spec_record(2, 8, 3, 0.01))
    assert ev.tau("text") is None  # 2 < 3 cycles
    assert ev.tau("text", min_cycles=1) == 5.0
    ev.add("text", spec_record(3, 8, 0, 0.01))
    assert ev.tau("text") == (6 + 4 + 1) / 3
    assert ev.tau("tool_call", min_cycles=1) is None
    for i in range(WINDOW):  # a collapse pushes the good start out of the window
        ev.add("text", spec_record(4 + i, 8, 0, 0.01))
    assert ev.tau("text") == 1.0 and ev.cycles("text") == WINDOW
    assert RequestEvidence(min_cycles=0).tau("text") is None  # off


def test_a_forced_run_leaves_the_span_to_the_class_estimates() -> None:
    ev = RequestEvidence(min_cycles=1)
    ev.add("json", spec_record(0, 8, 0, 0.01))
    assert ev.tau("json") == 1.0
    ev.add("json", forced_record(1, 6, 0.005))
    assert ev.tau("json") is None


def test_opening_backoff_frees_two_losses_then_doubles() -> None:
    bo = opening_backoff(free_losses=2, max_skip=4)
    assert bo.ask(SCOPE)
    assert bo.lost(SCOPE) == 0 and bo.ask(SCOPE)
    assert bo.lost(SCOPE) == 0 and bo.ask(SCOPE)
    assert bo.lost(SCOPE) == 1
    assert not bo.ask(SCOPE) and bo.ask(SCOPE)
    assert bo.lost(SCOPE) == 2
    assert [bo.ask(SCOPE) for _ in range(3)] == [False, False, True]
    assert bo.lost(SCOPE) == 4 and bo.lost(SCOPE) == 4  # capped
    bo.won(SCOPE)
    assert bo.ask(SCOPE) and bo.lost(SCOPE) == 0
    assert bo.ask(("m", "other", "text"))  # per scope


def _learn_ar_class(pol, steps: int = 40, cycle_s: float = 0.010) -> None:  # type: ignore[no-untyped-def]
    """The tool-result class: spec accepts 0 tokens per `cycle_s` cycle, AR 4 ms per token."""
    pol.model("m").estimates.observe_ar("m", 0.004, 300)
    ctrl = pol.controller_for("m", TOOL_RESULT, False)
    decision = ctrl.start(300, 8)
    for i in range(steps):
        rec = spec_record(i, 8, 0, cycle_s) if decision.mode == "spec" else ar_record(i, 0.004)
        decision = ctrl.after_step(rec, [0] * rec.committed, "word ")
    assert decision.mode == "ar"


def test_opening_probe_keeps_spec_for_a_request_that_accepts_well(tmp_path: Path) -> None:
    pol = policy(tmp_path, "exploration: {budget_per_request: 0}\n")
    _learn_ar_class(pol)
    ctrl = pol.controller_for("m", TOOL_RESULT, False)
    decision = ctrl.start(300, 8)
    assert decision.mode == "spec" and decision.block_size == 8
    assert ctrl.decisions[-1]["kind"] == "opening" and ctrl.openings == 1
    # This request copies from its context: 8 tokens per 10 ms cycle (800 tok/s vs AR 250).
    decision = ctrl.after_step(spec_record(0, 8, 7, 0.010), [0] * 8, "word ")
    assert decision.mode == "spec" and ctrl.decisions[-1]["kind"] == "opening-won"
    # Its own acceptance, not the class's (which says AR), keeps it speculative throughout.
    for i in range(1, 40):
        decision = ctrl.after_step(spec_record(i, 8, 7, 0.010), [0] * 8, "word ")
        assert decision.mode == "spec"
    assert ctrl.summary()["openings"] == 1


def test_opening_probe_returns_to_ar_and_backs_off(tmp_path: Path) -> None:
    pol = policy(tmp_path, "exploration: {budget_per_request: 0}\n")
    _learn_ar_class(pol)
    kinds = []
    for _ in range(5):
        ctrl = pol.controller_for("m", TOOL_RESULT, False)
        decision = ctrl.start(300, 8)
        kinds.append(ctrl.decisions[-1]["kind"])
        if decision.mode == "spec":
            decision = ctrl.after_step(spec_record(0, 8, 0, 0.010), [0], "word ")
            assert decision.mode == "ar" and ctrl.decisions[-1]["kind"] == "opening-lost"
    # Two free losses, then one request skipped after the third.
    assert kinds == ["opening", "opening", "opening", "start", "opening"]
    counts = {(c["labels"]["outcome"]): c["value"] for c in pol.counters().get("openings", [])}
    assert counts == {"lost": 4}


def test_prepared_starts_decide_as_unprepared_ones(tmp_path: Path) -> None:
    """`prepare` (run beside the prefill) reads ahead for every span kind; the starts it
    serves decide exactly as unprepared ones, and reading does not consume opening skips."""
    runs: dict[bool, list[tuple[str, str]]] = {}
    for prepared in (False, True):
        (tmp_path / str(prepared)).mkdir()
        pol = policy(tmp_path / str(prepared), "exploration: {budget_per_request: 0}\n")
        _learn_ar_class(pol)
        runs[prepared] = []
        for i in range(7):
            ctrl = pol.controller_for("m", TOOL_RESULT, False)
            if prepared:
                # The last one was prepared for another prompt length: start reads afresh.
                ctrl.prepare(5000 if i == 6 else 300, 8)
            decision = ctrl.start(300, 8)
            runs[prepared].append((ctrl.decisions[-1]["kind"], ctrl.decisions[-1]["reason"]))
            if decision.mode == "spec":
                ctrl.after_step(spec_record(0, 8, 0, 0.010), [0], "word ")
    assert runs[True] == runs[False]
    kinds = [k for k, _ in runs[True]]
    assert kinds == ["opening", "opening", "opening", "start", "opening", "start", "start"]


def test_no_opening_where_a_whole_block_could_not_beat_ar(tmp_path: Path) -> None:
    """A cycle of 8 at 40 ms commits at most 200 tok/s against AR's 250: an opening could only
    lose (a quantized target on a CPU, whose verify costs many AR steps), so none is run."""
    pol = policy(tmp_path, "exploration: {budget_per_request: 0}\n")
    _learn_ar_class(pol, cycle_s=0.040)
    for _ in range(3):
        ctrl = pol.controller_for("m", TOOL_RESULT, False)
        decision = ctrl.start(300, 8)
        assert decision.mode == "ar" and ctrl.decisions[-1]["kind"] == "start"
        assert ctrl.openings == 0


def test_opening_probe_off_by_config(tmp_path: Path) -> None:
    pol = policy(tmp_path, "exploration: {budget_per_request: 0, opening_probe: false}\n")
    _learn_ar_class(pol)
    decision = pol.controller_for("m", TOOL_RESULT, False).start(300, 8)
    assert decision.mode == "ar"


def test_request_recheck_leaves_spec_for_a_request_that_accepts_badly(tmp_path: Path) -> None:
    pol = policy(tmp_path, "exploration: {budget_per_request: 0}\n")
    # Chat: spec pays on the class (6 tokens per 10 ms cycle vs AR 4 ms per token) ...
    ctrl = pol.controller_for("m", CHAT, False)
    pol.model("m").estimates.observe_ar("m", 0.004, 300)
    decision = ctrl.start(300, 8)
    for i in range(60):
        decision = ctrl.after_step(spec_record(i, 8, 5, 0.010), [0] * 6, "word ")
    assert decision.mode == "spec"
    # ... but this request accepts nothing: its own cycles move it to AR at the first recheck,
    # long before 60 good cycles of class estimate would turn.
    ctrl = pol.controller_for("m", CHAT, False)
    decision = ctrl.start(300, 8)
    assert decision.mode == "spec"
    switched = None
    for i in range(20):
        rec = spec_record(i, 8, 0, 0.010) if decision.mode == "spec" else ar_record(i, 0.004)
        decision = ctrl.after_step(rec, [0] * rec.committed, "word ")
        if decision.mode == "ar":
            switched = i
            break
    assert switched is not None and switched <= 4
    assert (
        ctrl.decisions[-1]["kind"] == "request" and "this request's" in ctrl.decisions[-1]["reason"]
    )


def _request_in_a_spec_class(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A chat request's controller (and its start decision) in a class where spec pays."""
    pol = policy(tmp_path, "exploration: {budget_per_request: 0}\n")
    pol.model("m").estimates.observe_ar("m", 0.004, 300)
    ctrl = pol.controller_for("m", CHAT, False)
    ctrl.start(300, 8)
    for i in range(60):
        ctrl.after_step(spec_record(i, 8, 5, 0.010), [0] * 6, "word ")
    ctrl = pol.controller_for("m", CHAT, False)
    return ctrl, ctrl.start(300, 8)


def test_a_request_that_chose_ar_on_its_own_evidence_does_not_flap_back(tmp_path: Path) -> None:
    ctrl, decision = _request_in_a_spec_class(tmp_path)
    modes = []
    for i in range(80):  # this request: nothing accepted
        rec = spec_record(i, 8, 0, 0.010) if decision.mode == "spec" else ar_record(i, 0.004)
        decision = ctrl.after_step(rec, [0] * rec.committed, "word ")
        modes.append(decision.mode)
    # One switch to AR on its own evidence; the class estimates (still favouring spec) do not
    # switch it back at the rechecks that follow. Only single retry cycles run spec again,
    # after 16 and then 32 AR steps (each lost here: nothing is accepted).
    first_ar = modes.index("ar")
    retries = [i for i, m in enumerate(modes[first_ar:]) if m == "spec"]
    assert [b - a for a, b in zip(retries, retries[1:])] == [33]
    assert retries[0] == 16
    kinds = [d["kind"] for d in ctrl.decisions]
    assert kinds == ["start", "request", "retry", "retry-lost", "retry", "retry-lost"]
    assert [d["mode"] for d in ctrl.decisions[1:]] == ["ar", "spec", "ar", "spec", "ar"]
    assert ctrl.switches == 1


def test_a_retry_that_accepts_well_resumes_spec(tmp_path: Path) -> None:
    ctrl, decision = _request_in_a_spec_class(tmp_path)
    modes = []
    for i in range(60):  # a slow start (nothing accepted), then the drafter keeps up
        good = "ar" in modes
        if decision.mode == "spec":
            rec = spec_record(i, 8, 7 if good else 0, 0.010)
        else:
            rec = ar_record(i, 0.004)
        decision = ctrl.after_step(rec, [0] * rec.committed, "word ")
        modes.append(decision.mode)
    # The window still holds the slow start: the first retry (8 tokens) lifts it to 2.4
    # tokens per cycle, just under AR; the second, 32 AR steps later, wins back spec.
    first_ar = modes.index("ar")
    assert modes.index("spec", first_ar) - first_ar == 16
    assert set(modes[-6:]) == {"spec"}
    kinds = [d["kind"] for d in ctrl.decisions]
    assert kinds[1:] == ["request", "retry", "retry-lost", "retry", "retry-won"]


def test_an_opening_that_meets_a_forced_run_is_void(tmp_path: Path) -> None:
    pol = policy(tmp_path, "exploration: {budget_per_request: 0}\n")
    _learn_ar_class(pol)
    ctrl = pol.controller_for("m", TOOL_RESULT, False)
    assert ctrl.start(300, 8).mode == "spec" and ctrl.decisions[-1]["kind"] == "opening"
    ctrl.after_step(forced_record(0, 6, 0.005), [0] * 7, "word ")
    # No verdict from a forced run: the class chooses, and no loss is counted.
    assert ctrl.decisions[-1]["kind"] == "opening-void"
    assert "openings" not in pol.counters()
    # The class now has forced runs measured in this span: no more openings there.
    assert pol.controller_for("m", TOOL_RESULT, False).start(300, 8).mode == "ar"


def test_start_prefers_the_largest_block_among_near_equal_ones(tmp_path: Path) -> None:
    pol = policy(
        tmp_path, "exploration: {budget_per_request: 0}\ndefaults: {block_sizes: [8, 4]}\n"
    )
    est = pol.model("m").estimates
    label, ctx = CHAT.label, 300
    for _ in range(20):
        # Block 4: 4 tokens per 8 ms (500 tok/s); block 8: 5.9 per 12 ms (~492 tok/s).
        est.observe_spec("m", label, "text", 4, 3, 0.008, ctx)
        est.observe_spec("m", label, "text", 8, 4.9, 0.012, ctx)  # type: ignore[arg-type]
    est.observe_ar("m", 0.004, ctx)
    decision = pol.controller_for("m", CHAT, False).start(ctx, 8)
    assert (decision.mode, decision.block_size) == ("spec", 8)


def test_each_span_opens_with_a_probe_where_the_class_says_ar(tmp_path: Path) -> None:
    """Entering a tool call, where the class's tool calls lose to AR, one spec cycle reads this
    request's own: a call that copies from its context stays speculative, one that does not
    goes to AR after that one cycle."""
    from .test_controller import SCRIPT, TOOLS, WORLD
    from .world import World, drive

    pol = _policy(tmp_path)
    for seed in range(1):  # learns: spec in text, AR in tool calls (as in test_controller)
        drive(pol.controller_for("m", TOOLS, False), World(**WORLD, seed=seed), SCRIPT)  # type: ignore[arg-type]
    # This request's tool calls accept whole blocks.
    copying = World(**{**WORLD, "accepted": {**WORLD["accepted"], "tool_call": 7}})  # type: ignore[arg-type]
    ctrl = pol.controller_for("m", TOOLS, False)
    trace = drive(ctrl, copying, SCRIPT)
    calls = [(d["mode"], d["kind"]) for d in ctrl.decisions if d["span"] == "tool_call"]
    assert calls[:2] == [("spec", "opening"), ("spec", "opening-won")]
    in_calls = [m for s, m, _ in trace.steps if s == "tool_call"]
    assert in_calls.count("spec") > 0.9 * len(in_calls)
    # The class's estimate learned nothing from that request's calls past their opening
    # cycles (they ran spec because of its own acceptance): a request whose calls accept
    # nothing still runs them in AR.
    assert pol.model("m").estimates.spec("m", TOOLS.label, "tool_call", 8, 300)[0].tps < 250
    ctrl = pol.controller_for("m", TOOLS, False)
    trace = drive(ctrl, World(**WORLD), SCRIPT)  # type: ignore[arg-type]
    in_calls = [m for s, m, _ in trace.steps if s == "tool_call"]
    assert in_calls.count("ar") > 0.8 * len(in_calls)


def test_no_spec_probes_in_a_span_whose_opening_lost(tmp_path: Path) -> None:
    """The opening read this request's acceptance in the span: probing spec there again (here
    block 4, which has few samples) would only pay to read it once more."""
    pol = _policy(tmp_path)
    est = pol.model("m").estimates
    for _ in range(20):
        est.observe_ar("m", 0.004, 300)
    for accepted in (0, 1, 0):  # the class: spec8 ~150 tok/s vs AR 250, block 4 unmeasured
        est.observe_spec("m", TOOL_RESULT.label, "text", 8, accepted, 0.010, 300, (8, 4))
    ctrl = pol.controller_for("m", TOOL_RESULT, False)
    decision = ctrl.start(300, 8)
    for i in range(120):
        rec = spec_record(i, 8, 0, 0.010) if decision.mode == "spec" else ar_record(i, 0.004)
        decision = ctrl.after_step(rec, [0] * rec.committed, "w ")
    assert [d["kind"] for d in ctrl.decisions] == ["opening", "opening-lost"]
    assert ctrl.probes == 0
