"""A class seen for the first time starts from the pooled tau prior; when that prior is too
optimistic (spec pays in the other classes, not in this one) and AR is already measured, the policy
must switch to AR as soon as the arm has settled, not explore block sizes first."""

from __future__ import annotations

from pathlib import Path

from toolflash.policy.request_class import RequestClass

from .test_controller import policy
from .world import World, drive

TOOLS_USER = RequestClass(kind="tools", thinking="off", after_tool_result=False, length_band="lt1k")
TOOL_RESULT = RequestClass(kind="tools", thinking="off", after_tool_result=True, length_band="lt1k")
CYCLES = {8: 0.010, 4: 0.009, 2: 0.008}


def test_optimistic_prior_gives_way_to_measured_ar_quickly(tmp_path: Path) -> None:
    pol = policy(tmp_path, "defaults: {block_sizes: [8, 4, 2]}\n")
    # Spec pays well in text after a user turn (6 tokens per 10 ms vs AR 4 ms per token) ...
    fast = World(accepted={"text": 5}, cycle_s=CYCLES, ar_s=0.004, noise=0.05)
    for _ in range(3):
        drive(pol.controller_for("m", TOOLS_USER, False), fast, "words of text " * 30)
    # ... but after a tool result the drafter accepts nothing: 1 token per 8-10 ms.
    slow = World(accepted={"text": 0}, cycle_s=CYCLES, ar_s=0.004, noise=0.05)
    ctrl = pol.controller_for("m", TOOL_RESULT, False)
    trace = drive(ctrl, slow, "other words " * 20)
    first_ar = next(i for i, (_, m, _) in enumerate(trace.steps) if m == "ar")
    # Started on the prior, then AR once the arm settled (min_dwell 4): not after a chain of
    # block-size probes, as before (32 steps here).
    assert trace.steps[0][1] == "spec"
    assert first_ar <= 8
    assert sum(1 for _, m, _ in trace.steps if m == "spec") <= 8
    # (This request's own 4 cycles decide it: kind "request"; the class estimates agree.)
    assert any(d["kind"] in ("recheck", "request") and d["mode"] == "ar" for d in ctrl.decisions)
