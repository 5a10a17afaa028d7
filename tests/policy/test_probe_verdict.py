"""A probe judged by this request's own steps (`exploration.probe_verdict: request`): a class
mixes requests that copy their context with requests that do not, so its lookup estimate is
high where this request's lookup steps commit one token each, and its spec estimate low where
this request's drafts land. Judged by the class, a spec probe that committed 6 tokens a cycle
lost to lookup steps committing 1 (agent workload, tools user turns)."""

from __future__ import annotations

from pathlib import Path

from toolflash.policy.request_class import RequestClass

from .fakes import ar_record, lookup_record, spec_record
from .test_controller import policy

CHAT = RequestClass(kind="chat", thinking="off", after_tool_result=False, length_band="lt1k")


def _decisions(tmp_path: Path, verdict: str) -> list[dict]:
    """A class where lookup commits 3 tokens a 4 ms step and spec 16 ~1.7 a 6 ms cycle (three
    cycles: probed for few samples); a request whose lookup steps commit 1 token and whose
    spec cycles accept 5 of 15 drafted."""
    tmp_path.mkdir()
    extra = f"exploration: {{opening_probe: false, probe_verdict: {verdict}}}\n"
    pol = policy(tmp_path, extra + "defaults: {block_sizes: [16]}\n")
    est = pol.model("m").estimates
    label = CHAT.label
    for _ in range(20):
        est.observe_ar("m", 0.002, 300, ("m", label, "text"))
    for _request in range(6):
        for i in range(5):
            est.observe_lookup("m", label, "text", 8, 3, 0.004, first=i == 0)
    for a in (0, 0, 3):
        est.observe_spec("m", label, "text", 16, a, 0.006, 300, ())
    ctrl = pol.controller_for("m", CHAT, False)
    decision = ctrl.start(300, 16, 8)
    assert decision.mode == "lookup"
    for i in range(60):
        if decision.mode == "spec":
            record = spec_record(i, 16, 5, 0.006)
        elif decision.mode == "lookup":
            record = lookup_record(i, 1, 0.002)
        else:
            record = ar_record(i, 0.002)
        decision = ctrl.after_step(record, [0] * record.committed, "a" * record.committed)
    return ctrl.decisions


def test_a_probe_judged_by_the_request_keeps_what_it_found(tmp_path: Path) -> None:
    by_request = _decisions(tmp_path / "request", "request")
    ends = [d for d in by_request if d["kind"].startswith("probe-")]
    assert ends and ends[0]["kind"] == "probe-won" and ends[0]["mode"] == "spec", by_request
    assert by_request[-1]["mode"] == "spec"
    # The class's estimates (the default) read the same probe as lost.
    by_class = _decisions(tmp_path / "class", "class")
    ends = [d for d in by_class if d["kind"].startswith("probe-")]
    assert ends and ends[0]["kind"] == "probe-lost", by_class
