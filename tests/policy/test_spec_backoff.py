"""A lost spec probe backs off the drafter in its class and span, not only the block probed
(`exploration.spec_backoff`): one probe's cycles teach every smaller block's tau, and probing
16, then 8, then 4 in turn ran two lost probes in one request where lookup was twice as fast."""

from __future__ import annotations

from pathlib import Path

from toolflash.policy.request_class import RequestClass
from toolflash.policy.trial import probe_target

from .fakes import ar_record, spec_record
from .test_controller import policy

CHAT = RequestClass(kind="chat", thinking="off", after_tool_result=False, length_band="lt1k")


def test_probe_target() -> None:
    assert probe_target(("spec", 16), "drafter") == probe_target(("spec", 4), "drafter")
    assert probe_target(("spec", 16), "block") != probe_target(("spec", 4), "block")
    assert probe_target(("lookup", 8), "drafter") == ("lookup", 8)
    assert probe_target(("ar", 1), "drafter") == ("ar", 1)


def _spec_probes(tmp_path: Path, backoff: str) -> list[int]:
    """A class at AR 3.8 ms a token whose spec estimates are uncertain at every block (cycles
    that accept all or nothing: a little slower than AR at 16, 8 and 4), and a request of 120
    steps whose drafts all miss (no opening cycle). The steps its spec probes start at."""
    tmp_path.mkdir()
    pol = policy(tmp_path, f"exploration: {{spec_backoff: {backoff}, opening_probe: false}}\n")
    est = pol.model("m").estimates
    label = CHAT.label
    for _ in range(40):
        est.observe_ar("m", 0.0038, 300, ("m", label, "text"))
    costs = {16: 0.020, 8: 0.018, 4: 0.010}
    for i in range(4):
        for b, s in costs.items():
            est.observe_spec("m", label, "text", b, 7 if i % 2 else 0, s, 300, (8, 4))
    ctrl = pol.controller_for("m", CHAT, False)
    decision = ctrl.start(300, 16)
    assert decision.mode == "ar"
    for i in range(120):
        if decision.mode == "spec":
            record = spec_record(i, decision.block_size, 0, costs[decision.block_size])
        else:
            record = ar_record(i, 0.0038)
        decision = ctrl.after_step(record, [0] * record.committed, "a")
    return [d["step"] for d in ctrl.decisions if d["kind"] == "probe" and d["mode"] == "spec"]


def test_a_lost_spec_probe_backs_off_every_block(tmp_path: Path) -> None:
    shared = _spec_probes(tmp_path / "drafter", "drafter")
    per_block = _spec_probes(tmp_path / "block", "block")
    assert len(shared) >= 2 and len(per_block) >= 2 and shared[0] == per_block[0]
    # Shared: the next spec probe, at any block, waits the backoff's 32 steps of the span
    # after the loss (and the 3 cycles of the probe); per block, another block is probed as
    # soon as the request's probe share allows.
    assert all(b - a >= 3 + 32 for a, b in zip(shared, shared[1:]))
    assert per_block[1] - per_block[0] < 3 + 32
