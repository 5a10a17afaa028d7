"""The lookup arm in the adaptive policy: which arms a rule allows, lookup's own estimates (learned
whole, pooled, persisted), and a controller that chooses among AR, spec and lookup per span, or
between AR and lookup for a target without a drafter."""

from __future__ import annotations

from pathlib import Path

from toolflash.policy import decide
from toolflash.policy.config import SpanRule
from toolflash.policy.estimates import Estimates

from .fakes import FakeClock
from .test_controller import SCRIPT, TOOLS, policy
from .world import Trace, World, drive

RULE = SpanRule("adaptive", (16, 8, 4), 0.05, 0.8, 3.0, lookup=True)

# Text: spec commits 6 tokens per 10 ms (600 tok/s), lookup finds nothing (1 token per 4.2 ms),
# AR 250 tok/s. Tool calls copy their context: lookup commits 4 tokens per 6 ms (667 tok/s),
# spec 1 token per cycle (100 tok/s).
WORLD = dict(
    accepted={"text": 5, "tool_call": 0, "json": 0, "reasoning": 5},
    cycle_s={8: 0.010, 4: 0.008, 2: 0.0065},
    ar_s=0.004,
    lookup_tokens={"text": 1, "tool_call": 4, "json": 1, "reasoning": 1},
    lookup_s=0.0045,
)


def test_arms_per_rule_and_engine() -> None:
    assert decide.arms(RULE, 16, 8) == [
        ("spec", 16),
        ("spec", 8),
        ("spec", 4),
        ("lookup", 8),
        decide.AR,
    ]
    assert decide.arms(RULE, 0, 8) == [("lookup", 8), decide.AR]  # no drafter
    assert decide.arms(RULE, 8, 0) == [("spec", 8), ("spec", 4), decide.AR]  # no lookup
    off = SpanRule("adaptive", (8,), 0.05, 0.8, 3.0, lookup=False)
    assert decide.arms(off, 8, 8) == [("spec", 8), decide.AR]
    only = SpanRule("lookup", (8,), 0.05, 0.8, 3.0)
    assert decide.arms(only, 8, 6) == [("lookup", 6)]
    assert decide.arms(only, 8, 0) == [decide.AR]  # an arm the engine cannot run
    spec_only = SpanRule("spec", (8,), 0.05, 0.8, 3.0)
    assert decide.arms(spec_only, 0, 8) == [decide.AR]
    assert decide.arm_name(("lookup", 8)) == "lookup8"


def test_lookup_estimates_are_learned_whole_pooled_and_persisted() -> None:
    est = Estimates(clock=FakeClock())
    for _ in range(10):  # ten requests of two steps
        est.observe_lookup("m", "c", "tool_call", 8, 4, 0.006, first=True)
        est.observe_lookup("m", "c", "tool_call", 8, 1, 0.004)
    tps, per_step = est.lookup("m", "c", "tool_call", 8)
    # Decayed means: the older samples weigh slightly less.
    assert abs(per_step - 2.5) < 0.05
    assert abs(tps.tps - 2.5 / 0.005) < 5 and tps.samples > 3
    # Another class of the span starts from the pool, with no samples of its own.
    prior, _ = est.lookup("m", "other", "tool_call", 8)
    assert prior.known and prior.samples == 0
    assert not est.lookup("m", "c", "tool_call", 4)[0].known
    restored = Estimates(clock=FakeClock())
    restored.load_json(est.to_json())
    assert restored.lookup("m", "c", "tool_call", 8)[0] == tps


def run(tmp_path: Path, block: int, lookup_block: int, extra: str = "") -> list[Trace]:
    pol = policy(tmp_path, extra)
    traces = []
    for seed in range(6):
        ctrl = pol.controller_for("m", TOOLS, False)
        world = World(**WORLD, noise=0.05, seed=seed)  # type: ignore[arg-type]
        traces.append(drive(ctrl, world, SCRIPT, block=block, lookup_block=lookup_block))
    return traces


def share(traces: list[Trace], span: str, mode: str) -> float:
    steps = [m for t in traces for s, m, _ in t.steps if s == span]
    return sum(1 for m in steps if m == mode) / len(steps)


def test_three_arms_each_span_takes_its_fastest(tmp_path: Path) -> None:
    late = run(tmp_path, 8, 8)[-3:]
    assert share(late, "tool_call", "lookup") > 0.6
    assert share(late, "text", "spec") > 0.7
    assert share(late, "text", "lookup") < 0.2


def test_without_a_drafter_ar_or_lookup(tmp_path: Path) -> None:
    traces = run(tmp_path, 0, 8)
    assert all(m != "spec" for t in traces for _, m, _ in t.steps)
    late = traces[-3:]
    assert share(late, "tool_call", "lookup") > 0.6
    assert share(late, "text", "ar") > 0.7


def test_lookup_turned_off_by_the_policy_file(tmp_path: Path) -> None:
    traces = run(tmp_path, 8, 8, "defaults: {lookup: false}\n")
    assert all(m != "lookup" for t in traces for _, m, _ in t.steps)
