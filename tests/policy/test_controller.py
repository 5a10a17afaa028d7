"""Decisions from scripted cycle records: AR inside tool calls where spec loses there, spec in
text where it pays, no flapping, bounded probes with backoff, explained and counted decisions."""

from __future__ import annotations

import json
from pathlib import Path

from toolflash.engine.api import GenerationStats
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig
from toolflash.policy.request_class import RequestClass
from toolflash.policy.throughput import Throughput

from .fakes import FakeClock, ar_record, spec_record
from .world import Trace, World, drive

TOOLS = RequestClass(kind="tools", thinking="off", after_tool_result=False, length_band="lt1k")
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app/main.py", "n": 1}}\n</tool_call>'
SCRIPT = (
    "I will read the file first and then explain what it does in detail. " * 3
    + CALL
    + "\nNow the next step of the plan, written out as plain text for the user. " * 3
    + CALL
)

# Text: spec at block 8 commits 6 tokens per 10 ms (600 tok/s) vs AR 250 tok/s.
# Tool calls: spec commits 1 token per cycle (100 tok/s): AR is faster there.
WORLD = dict(
    accepted={"text": 5, "tool_call": 0, "json": 0, "reasoning": 5},
    cycle_s={8: 0.010, 4: 0.008, 2: 0.0065},
    ar_s=0.004,
)


def policy(tmp_path: Path, extra: str = "") -> AdaptivePolicy:
    # Scripted records carry their own timings: measure cycles, not the wall clock.
    base = tmp_path / "cycle-timing.yaml"
    base.write_text("estimates: {timing: cycle}\n")
    files = [base]
    if extra:
        f = tmp_path / "extra.yaml"
        f.write_text(extra)
        files.append(f)
    return AdaptivePolicy(
        PolicyConfig(files), clock=FakeClock(), state_file=str(tmp_path / "state.json")
    )


def share(trace: Trace, span: str, mode: str) -> float:
    steps = [m for s, m, _ in trace.steps if s == span]
    return sum(1 for m in steps if m == mode) / len(steps)


def test_ar_inside_tool_calls_spec_in_text(tmp_path: Path) -> None:
    pol = policy(tmp_path)
    traces = []
    for seed in range(4):
        ctrl = pol.controller_for("m", TOOLS, False)
        traces.append(drive(ctrl, World(**WORLD, noise=0.05, seed=seed), SCRIPT))  # type: ignore[arg-type]
    last = traces[-1]
    assert share(last, "tool_call", "ar") > 0.8
    assert share(last, "text", "spec") > 0.9
    assert traces[-1].seconds < traces[0].seconds  # learning pays
    # In text the best block is 8 (6 tokens / 10 ms beats 4 / 8 ms and 2 / 6.5 ms).
    text_blocks = [b for s, m, b in last.steps if s == "text" and m == "spec"]
    assert text_blocks.count(8) / len(text_blocks) > 0.9  # others are probes
    # Every switch is explained: entering a call goes to AR, leaving it back to spec.
    summary = ctrl.summary()
    json.dumps(summary)
    span_decisions = [d for d in summary["decisions"] if d["kind"] == "span"]
    assert [(d["span"], d["mode"]) for d in span_decisions] == [
        ("tool_call", "ar"),
        ("text", "spec"),
        ("tool_call", "ar"),
        ("text", "spec"),
    ]
    into_call = span_decisions[0]
    assert into_call["surplus"] < 0 and into_call["p_spec_faster"] < 0.2
    assert "beats" in into_call["reason"]


def test_no_flapping_when_modes_are_close(tmp_path: Path) -> None:
    # Spec 2 tokens per 8 ms (250 tok/s) vs AR 4 ms (250 tok/s), 10% timing noise.
    world = World(
        accepted={"text": 1, "tool_call": 1},
        cycle_s={8: 0.008, 4: 0.0085, 2: 0.009},
        ar_s=0.004,
        noise=0.1,
    )
    pol = policy(tmp_path)
    script = "plain text that goes on and on " * 40
    switches = 0
    for _ in range(3):
        ctrl = pol.controller_for("m", TOOLS, False)
        drive(ctrl, world, script)
        switches += ctrl.switches
        rechecks = [d for d in ctrl.decisions if d["kind"] == "recheck"]
        assert len(rechecks) <= 2
    assert switches <= 4


def test_losing_probes_back_off_exponentially(tmp_path: Path) -> None:
    # AR never pays in text; after it is measured, the policy should stop probing it.
    world = World(
        accepted={"text": 7}, cycle_s={8: 0.010, 4: 0.009, 2: 0.008}, ar_s=0.02, noise=0.05
    )
    pol = policy(tmp_path, "exploration: {budget_per_request: 1000, backoff_base_steps: 8}\n")
    script = "text " * 400
    probes_per_request = []
    for _ in range(4):
        ctrl = pol.controller_for("m", TOOLS, False)
        trace = drive(ctrl, world, script)
        probes_per_request.append(ctrl.probes)
    ar_steps = sum(1 for _, m, _ in trace.steps if m == "ar")
    assert probes_per_request[0] >= 1
    assert sum(probes_per_request[1:]) <= 3  # 8, 16, 32... steps apart, then decisive
    assert ar_steps <= 6
    rows = pol.counters()["probes"]
    assert any(r["labels"]["outcome"] == "lost" and r["labels"]["arm"] == "ar" for r in rows)


def test_probe_budget_per_request(tmp_path: Path) -> None:
    pol = policy(tmp_path, "exploration: {budget_per_request: 2, probe_ar_steps: 6}\n")
    ctrl = pol.controller_for("m", TOOLS, False)
    drive(ctrl, World(**WORLD), "text " * 100)  # type: ignore[arg-type]
    assert ctrl.probe_steps <= 2


def test_forced_modes_from_config(tmp_path: Path) -> None:
    pol = policy(
        tmp_path,
        "classes:\n  'tools.*':\n    tool_call: {mode: ar}\n    text: {mode: spec, block_sizes: [4]}\n",
    )
    ctrl = pol.controller_for("m", TOOLS, False)
    trace = drive(ctrl, World(**WORLD), SCRIPT)  # type: ignore[arg-type]
    assert share(trace, "tool_call", "ar") == 1.0
    assert {(m, b) for s, m, b in trace.steps if s == "text"} == {("spec", 4)}
    assert all(d["kind"] == "forced" for d in ctrl.decisions)


def test_json_response_format_uses_json_estimates(tmp_path: Path) -> None:
    pol = policy(tmp_path)
    json_class = RequestClass("json", "off", False, "lt1k")
    for _ in range(3):
        ctrl = pol.controller_for("m", json_class, True)
        trace = drive(ctrl, World(**WORLD), '{"answer": "' + "x" * 200 + '"}')  # type: ignore[arg-type]
    assert ctrl.spans.kind == "json"
    # Learned: spec accepts nothing in JSON here. Each request opens with one spec cycle (the
    # opening probe reads the request's own acceptance; in this world the first token, before
    # the `{`, is text and accepts well), and this request's own cycles hand it to AR soon;
    # after that only single retry cycles, ever further apart (16, 32, ... AR steps).
    assert trace.steps[0][1] == "spec" and ctrl.decisions[0]["kind"] == "opening"
    later = [m for _, m, _ in trace.steps[5:]]
    retries = [i for i, m in enumerate(later) if m == "spec"]
    assert len(retries) <= 3 and all(b - a > 16 for a, b in zip(retries, retries[1:]))
    assert any(k[2] == "json" for k in pol.model("m").estimates.tau)


def test_counters_and_persistence_across_restart(tmp_path: Path) -> None:
    pol = policy(tmp_path)
    for seed in range(3):
        drive(pol.controller_for("m", TOOLS, False), World(**WORLD, seed=seed), SCRIPT)  # type: ignore[arg-type]
    counters = pol.counters()
    assert set(counters) >= {"decisions", "steps", "tokens", "requests"}
    tokens = sum(r["value"] for r in counters["tokens"])
    assert tokens == 3 * len(SCRIPT)
    pol.save()
    restarted = policy(tmp_path)
    ctrl = restarted.controller_for("m", TOOLS, False)
    trace = drive(ctrl, World(**WORLD), SCRIPT)  # type: ignore[arg-type]
    assert share(trace, "tool_call", "ar") > 0.8  # learned before the restart
    assert ctrl.probes <= 2


def test_prefix_text_and_wall_timing(tmp_path: Path) -> None:
    # The prefill's token opened a tool call: the first cycle is already inside it.
    pol = AdaptivePolicy(PolicyConfig(), clock=FakeClock(), persist=False)
    ctrl = pol.controller_for("m", TOOLS, False)
    ctrl.observe_prefix("<tool_call>")
    ctrl.start(300, 8)
    assert ctrl.spans.kind == "tool_call"
    # The request's first cycle settles the arm: its tokens are learned, its time is not.
    ctrl.after_step(spec_record(0, 8, 0, 0.01), [0], "{")
    ctrl.apply_observations()
    assert ("m", 8, 512) not in pol.model("m").estimates.cycle_s
    # Wall timing: the time between steps, at most twice the cycle's own time.
    ctrl.after_step(spec_record(1, 8, 0, 10.0), [0], "{")
    ctrl.apply_observations()
    stat = pol.model("m").estimates.cycle_s[("m", 8, 512)]
    assert 0 < stat.mean < 1.0  # real elapsed time (microseconds), not the record's 10 s
    first = stat.s1
    ctrl._t_last -= 100.0  # a consumer that stalled for 100 s between two events
    ctrl.after_step(spec_record(2, 8, 0, 0.01), [0], '"name"')
    ctrl.apply_observations()
    assert stat.count == 2
    assert stat.s1 <= first + 0.02 + 1e-9  # the 100 s stall was clipped to 2 x 10 ms
    assert "steps" not in pol.counters()  # published when the request finishes
    ctrl.finish(GenerationStats(300, 0, 3, 0.0, 0.03, ()))
    assert pol.counters()["steps"] == [
        {
            "labels": {"class": TOOLS.label, "mode": "spec", "model": "m", "span": "tool_call"},
            "value": 3,
        }
    ]


def test_decisions_are_published_in_order_when_the_request_finishes(tmp_path: Path) -> None:
    """Between decode steps a decision is only recorded; its response entry, log line and
    counter come at finish (or when read), in order, each with the step it was made at."""
    from structlog.testing import capture_logs

    pol = policy(tmp_path, "decisions: {max_recorded: 2}\n")
    drive(pol.controller_for("m", TOOLS, False), World(**WORLD), SCRIPT)  # type: ignore[arg-type]

    def counted() -> int:
        return sum(r["value"] for r in pol.counters()["decisions"])

    before = counted()
    ctrl = pol.controller_for("m", TOOLS, False)
    with capture_logs() as logs:
        decision = ctrl.start(300, 8)
        # A tool call from step 10 to 20: its span runs AR, then text spec again.
        texts = {10: CALL[:20], 20: CALL[20:]}
        for i in range(60):
            text = texts.get(i, "word ")
            rec = spec_record(i, 8, 5, 0.010) if decision.mode == "spec" else ar_record(i, 0.004)
            decision = ctrl.after_step(rec, [0] * rec.committed, text)
        assert not logs and counted() == before
        ctrl.finish(GenerationStats(300, 0, 60, 0.0, 0.5, ()))
    lines = [e for e in logs if e["event"] == "policy.decision"]
    assert len(lines) >= 3
    assert [e["step"] for e in lines] == sorted(e["step"] for e in lines)
    assert lines[0]["kind"] == "start" and lines[0]["step"] == 0
    assert counted() - before == len(lines)
    summary = ctrl.summary()  # listed up to max_recorded, the rest counted as dropped
    assert len(summary["decisions"]) == 2
    assert summary["decisions_dropped"] == len(lines) - 2


def test_rechecks_back_off_while_the_choice_is_clear_and_still_catch_a_change(
    tmp_path: Path,
) -> None:
    # Spec clearly beats AR in text; rechecks that change nothing double their interval (up to
    # recheck_max), so a long span costs a few estimate reads, not one every 8 steps...
    from toolflash.policy.controller import PolicyController

    pol = policy(
        tmp_path, "exploration: {budget_per_request: 0}\nestimates: {sample_half_life: 8}\n"
    )
    ctrl = pol.controller_for("m", TOOLS, False)
    calls = 0
    choose = PolicyController.choose

    def counting(self: PolicyController, *args: object) -> object:
        nonlocal calls
        calls += 1
        return choose(self, *args)  # type: ignore[arg-type]

    ctrl.choose = counting.__get__(ctrl)  # type: ignore[method-assign]
    pol.model("m").estimates.observe_ar("m", 0.004, 300)
    decision = ctrl.start(300, 8)
    assert decision.mode == "spec"
    steps = 0
    for i in range(200):
        decision = ctrl.after_step(spec_record(i, 8, 5, 0.010), [0] * 6, "word ")
        steps += 1
    assert decision.mode == "spec"
    assert calls <= 2 + steps // 32 + 4  # start, then 8, 16, 32, 32, ... steps apart
    # ...and a collapse of acceptance inside the same span is still caught within recheck_max
    # steps of the estimate turning (a few cycles at this sample half-life).
    switched_at = None
    for i in range(200, 300):
        rec = spec_record(i, 8, 0, 0.010) if decision.mode == "spec" else ar_record(i, 0.004)
        decision = ctrl.after_step(rec, [0] * rec.committed, "word ")
        if decision.mode == "ar":
            switched_at = i
            break
    assert switched_at is not None and switched_at - 200 <= 48


def test_each_span_takes_its_own_block_size(tmp_path: Path) -> None:
    # Reasoning accepts 3 draft tokens (block 4 is fastest: 4 tokens per 7.5 ms), tool calls
    # accept all 15 (block 16: 16 tokens per 12 ms). Entering the call must not keep the
    # reasoning's block: a span's first decision picks its block afresh.
    world = dict(
        accepted={"reasoning": 3, "tool_call": 15, "text": 3},
        cycle_s={16: 0.012, 8: 0.009, 4: 0.0075},
        ar_s=0.004,
        noise=0.05,
    )
    think = RequestClass(kind="tools", thinking="on", after_tool_result=False, length_band="lt1k")
    script = "<think>\n" + "Plan: read the file, then fix the bug in it. " * 4 + "</think>\n\n"
    script += CALL * 2
    pol = policy(tmp_path)
    for seed in range(6):
        ctrl = pol.controller_for("m", think, False)
        trace = drive(ctrl, World(**world, seed=seed), script, block=16)  # type: ignore[arg-type]
    call_blocks = [b for s, m, b in trace.steps if s == "tool_call" and m == "spec"]
    think_blocks = [b for s, m, b in trace.steps if s == "reasoning" and m == "spec"]
    assert call_blocks and call_blocks.count(16) / len(call_blocks) > 0.8
    assert think_blocks and think_blocks.count(16) / len(think_blocks) < 0.5


def test_span_entry_picks_the_spans_block_without_waiting_for_confidence(
    tmp_path: Path,
) -> None:
    # In the new span, block 16 measures 20% faster than the current block 8, but with a
    # spread that leaves p(16 faster) below min_confidence: a within-span recheck keeps 8
    # (hysteresis), the span's first decision takes 16 (a block change cannot flap).
    ctrl = policy(tmp_path).controller_for("m", TOOLS, False)
    ctrl.start(300, 16)
    table = {
        ("spec", 16): Throughput(1200.0, 400.0, 3.0),
        ("spec", 8): Throughput(1000.0, 400.0, 3.0),
        ("spec", 4): Throughput(500.0, 50.0, 3.0),
        ("ar", 1): Throughput(250.0, 10.0, 20.0),
    }
    ctrl.reads.throughput = lambda arm, span: table[arm]  # type: ignore[method-assign]
    ctrl.arm = ("spec", 8)
    rule = ctrl.policy.rule(ctrl.label, "tool_call")
    kept, _, _ = ctrl.choose(rule, "tool_call", ("spec", 8))
    fresh, reason, kind = ctrl.choose(rule, "tool_call", ("spec", 8), fresh_block=True)
    assert kept == ("spec", 8)
    assert fresh == ("spec", 16) and kind == "span" and "block size for this span" in reason
    # Spec vs AR keeps its hysteresis: AR faster with confidence still wins at span entry.
    table[("ar", 1)] = Throughput(5000.0, 10.0, 20.0)
    assert ctrl.choose(rule, "tool_call", ("spec", 8), fresh_block=True)[0] == ("ar", 1)


def test_cycles_the_draft_length_shrank_count_for_the_arms_tau(tmp_path: Path) -> None:
    """Under the engine's adaptive draft length a spec16 arm runs blocks of 8, 4, 2 after
    rejected drafts. Those cycles still say what block 16 would have committed where the draft
    missed: counted, a span whose drafts miss reads as losing, not as its two full-size
    cycles."""
    pol = policy(tmp_path, "exploration: {budget_per_request: 0}\n")
    ctrl = pol.controller_for("m", TOOLS, False)
    assert ctrl.start(300, 16).block_size == 16
    blocks = [16, 16, 8, 4, 2, 2, 2, 2, 2, 2]
    for i, b in enumerate(blocks):
        ctrl.after_step(spec_record(i, b, 0, 0.004 + 0.0005 * b), [0], "w")
    ctrl.apply_observations()
    est = pol.model("m").estimates
    tau = est.tau[("m", TOOLS.label, "text", 16)]
    assert tau.count == len(blocks) and tau.mean == 1.0
    # Time stays the block's own: only the two full-size cycles measured block 16's.
    assert est.cycle_seconds("m", 16, 300) == 0.012


def test_a_smaller_block_must_beat_the_largest_with_confidence(tmp_path: Path) -> None:
    """The decided block is a ceiling the engine's draft length shrinks below: near-equal or
    uncertain estimates keep the largest block; a smaller one takes over only when it is
    faster by the margin with confidence."""
    ctrl = policy(tmp_path).controller_for("m", TOOLS, False)
    ctrl.start(300, 16)
    table = {
        ("spec", 16): Throughput(600.0, 100.0, 12.0),
        ("spec", 8): Throughput(700.0, 100.0, 70.0),  # faster, but p(8 faster) ~0.76
        ("spec", 4): Throughput(400.0, 20.0, 70.0),
        ("ar", 1): Throughput(250.0, 10.0, 20.0),
    }
    ctrl.reads.throughput = lambda arm, span: table[arm]  # type: ignore[method-assign]
    rule = ctrl.policy.rule(ctrl.label, "reasoning")
    assert ctrl.choose(rule, "reasoning", None)[0] == ("spec", 16)
    table[("spec", 8)] = Throughput(800.0, 20.0, 70.0)  # now clearly faster
    table[("spec", 16)] = Throughput(600.0, 20.0, 12.0)
    assert ctrl.choose(rule, "reasoning", None)[0] == ("spec", 8)


def test_what_requests_taught_can_be_dropped(tmp_path: Path) -> None:
    """`learned()` copies the estimates and backoffs; `restore` drops what came after (the agent
    workload benchmark's repeat passes run so)."""
    pol = policy(tmp_path)
    drive(pol.controller_for("m", TOOLS, False), World(**WORLD), SCRIPT)  # type: ignore[arg-type]
    before = pol.learned()

    def taus() -> dict[object, list[float]]:
        return {k: v.to_list() for k, v in pol.model("m").estimates.tau.items()}

    first = taus()
    drive(pol.controller_for("m", TOOLS, False), World(**WORLD), SCRIPT)  # type: ignore[arg-type]
    assert taus() != first
    pol.restore(before)
    assert taus() == first
