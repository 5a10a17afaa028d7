"""A grow probe (`exploration.grow_after`): where the current spec block keeps accepting whole
blocks, the next larger block is probed and kept when this request's own cycles there beat the
smaller block's. A whole block is censored evidence ("at least this block"), so the estimates
alone never send a span back up: qwen35 code dropped to block 4 after a few poor cycles at 16,
then accepted whole blocks of 4 to the end of the request."""

from __future__ import annotations

from pathlib import Path

from toolflash.engine.api import CycleRecord, ModeDecision
from toolflash.policy.controller import PolicyController
from toolflash.policy.decide import grow_target
from toolflash.policy.request_class import RequestClass

from .fakes import ar_record, spec_record
from .test_controller import policy

CHAT = RequestClass(kind="chat", thinking="off", after_tool_result=False, length_band="lt1k")
COSTS = {16: 0.006, 8: 0.0035, 4: 0.0026}
AR_S = 0.002
ARMS = [("spec", 16), ("spec", 8), ("spec", 4), ("ar", 1)]


def test_grow_target() -> None:
    assert grow_target(("spec", 4), ARMS, 4, 4) == ("spec", 8)
    assert grow_target(("spec", 8), ARMS, 9, 4) == ("spec", 16)
    assert grow_target(("spec", 4), ARMS, 3, 4) is None  # not enough whole blocks yet
    assert grow_target(("spec", 16), ARMS, 9, 4) is None  # the largest already
    assert grow_target(("spec", 4), ARMS, 9, 0) is None  # off
    assert grow_target(("ar", 1), ARMS, 9, 4) is None
    assert grow_target(("spec", 4), [("spec", 16), ("spec", 4)], 4, 4) == ("spec", 16)


def _controller(tmp_path: Path, extra: str) -> tuple[PolicyController, ModeDecision]:
    """A request of a class whose first cycles missed at 16 and 8 and landed at 4: it starts
    at 4."""
    tmp_path.mkdir()
    pol = policy(tmp_path, "exploration: {opening_probe: false" + extra + "}\n")
    est = pol.model("m").estimates
    label = CHAT.label
    for _ in range(20):
        est.observe_ar("m", AR_S, 300, ("m", label, "text"))
    for a in (1, 0, 2, 0, 1, 0):
        est.observe_spec("m", label, "text", 16, a, COSTS[16], 300, (8, 4))
    for a in (1, 0, 2, 0):
        est.observe_spec("m", label, "text", 8, a, COSTS[8], 300, (4,))
    for a in (3, 3, 3, 0, 3, 3):
        est.observe_spec("m", label, "text", 4, a, COSTS[4], 300, ())
    ctrl = pol.controller_for("m", CHAT, False)
    decision = ctrl.start(300, 16)
    assert (decision.mode, decision.block_size) == ("spec", 4), ctrl.decisions
    return ctrl, decision


def _run(tmp_path: Path, extra: str, accepts: dict[int, int], steps: int = 80) -> list[dict]:
    """That request, its drafts accepting `accepts[block]` tokens a cycle: its decisions."""
    ctrl, decision = _controller(tmp_path, extra)
    for i in range(steps):
        if decision.mode == "spec":
            b = decision.block_size
            record = spec_record(i, b, accepts[b], COSTS[b])
        else:
            record = ar_record(i, AR_S)
        decision = ctrl.after_step(record, [0] * record.committed, "a" * record.committed)
    return ctrl.decisions


def test_whole_blocks_grow_to_the_largest(tmp_path: Path) -> None:
    whole = {b: b - 1 for b in COSTS}
    grown = _run(tmp_path / "on", "", whole)
    kinds = [(d["kind"], d["block_size"]) for d in grown]
    assert ("grow-won", 8) in kinds and ("grow-won", 16) in kinds, kinds
    assert grown[-1]["mode"] == "spec" and grown[-1]["block_size"] == 16
    # Without it the request stays at 4: the class's estimates of 8 and 16 are floored at 4's
    # tau, and cycles of 4 accepted whole never teach them more.
    stuck = _run(tmp_path / "off", ", grow_after: 0", whole)
    assert all(d["block_size"] == 4 for d in stuck if d["mode"] == "spec"), stuck


def test_a_lost_grow_probe_goes_back_and_backs_off(tmp_path: Path) -> None:
    # Whole blocks at 4, but 8 commits no more than 4 does (at a higher cost): lost.
    decisions = _run(tmp_path / "lost", "", {16: 3, 8: 3, 4: 3}, steps=120)
    grows = [d for d in decisions if d["kind"] == "grow"]
    lost = [d for d in decisions if d["kind"] == "grow-lost"]
    assert grows and len(lost) == len(grows), decisions
    assert all(d["block_size"] == 4 for d in lost)
    # The next grow probe waits the probes' backoff (32 steps of the span, then 64).
    starts = [d["step"] for d in grows]
    assert all(b - a >= 32 for a, b in zip(starts, starts[1:])), starts
    assert len(grows) <= 3


def test_a_grow_verdict_leaves_out_shorter_cycles_accepted_whole(tmp_path: Path) -> None:
    # A probe of 8: a whole block (8 tokens), a 2-token cycle accepted whole (the draft length
    # growing back, or max_tokens: only "at least 2"), a cycle of 8 that committed 5. Over its
    # two measures the probe commits 6.5 a cycle (1857 tok/s against 1538 for whole blocks of
    # 4); counting the censored cycle as 2 tokens would read 5 (1429) and lose.
    ctrl, decision = _controller(tmp_path / "censored", ", grow_after: 2")
    for i in range(2):
        decision = ctrl.after_step(spec_record(i, 4, 3, COSTS[4]), [0] * 4, "aaaa")
    assert (decision.mode, decision.block_size) == ("spec", 8), ctrl.decisions
    short = CycleRecord(2, "spec", 2, 1, 1, 2, 0.001, 0.001, 0.0, 300)
    for record in (spec_record(3, 8, 7, COSTS[8]), short):
        ctrl.after_step(record, [0] * record.committed, "a" * record.committed)
    decision = ctrl.after_step(spec_record(5, 8, 4, COSTS[8]), [0] * 5, "aaaaa")
    assert ctrl.decisions[-1]["kind"] == "grow-won", ctrl.decisions[-1]
    assert (decision.mode, decision.block_size) == ("spec", 8)
