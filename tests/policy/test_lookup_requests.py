"""Lookup's own samples count requests, not steps: whether an output copies its context is a
property of the request, so a few steps of one request that copied nothing do not rule lookup
out of its class (on the agent workload four steps of one JSON answer did, for the whole run,
where lookup was the faster arm over the class)."""

from __future__ import annotations

from pathlib import Path

from toolflash.policy.estimates import Estimates
from toolflash.policy.request_class import RequestClass

from .fakes import FakeClock, ar_record, lookup_record
from .test_controller import policy

JSON = RequestClass(kind="json", thinking="off", after_tool_result=False, length_band="lt1k")


def test_lookup_samples_count_the_requests_measured() -> None:
    est = Estimates(clock=FakeClock())
    for i in range(12):  # one request, twelve steps
        est.observe_lookup("m", "c", "json", 8, 1, 0.004, first=i == 0)
    one = est.lookup("m", "c", "json", 8)[0]
    assert one.known and one.samples == 1.0
    for _ in range(3):  # three more requests
        est.observe_lookup("m", "c", "json", 8, 1, 0.004, first=True)
    assert 3.9 < est.lookup("m", "c", "json", 8)[0].samples <= 4.0
    # The pools are priors: no own samples whatever they saw.
    assert est.lookup("m", "other", "json", 8)[0].samples == 0


def _probed(tmp_path: Path, samples: str = "requests") -> list[str]:
    """A JSON class measured at AR 4 ms a token (no drafter), where one earlier request ran
    lookup for 12 steps that copied nothing at 5 ms each (200 tok/s, decisively slower than
    AR). The lookup decisions of the next request, 60 steps of AR."""
    tmp_path.mkdir()
    pol = policy(tmp_path, f"estimates: {{lookup_samples: {samples}}}\n")
    est = pol.model("m").estimates
    for _ in range(40):
        est.observe_ar("m", 0.004, 300, ("m", JSON.label, "json"))
    for i in range(12):
        est.observe_lookup("m", JSON.label, "json", 8, 1, 0.005, first=i == 0)
    ctrl = pol.controller_for("m", JSON, True)
    assert ctrl.start(300, 0, 8).mode == "ar"
    for i in range(60):
        decision = ctrl.after_step(ar_record(i, 0.004), [0], "a")
        if decision.mode == "lookup":
            ctrl.after_step(lookup_record(i, 1, 0.005), [0], "a")
    return [d["kind"] for d in ctrl.decisions if d["mode"] == "lookup"]


def test_one_request_that_copied_nothing_does_not_rule_lookup_out(tmp_path: Path) -> None:
    # Lookup measured in one request only: the next request still probes it (within its
    # share of the steps). Counted by steps, 12 samples at p ~ 0 decided it for good.
    assert _probed(tmp_path / "requests")[:1] == ["probe"]
    assert _probed(tmp_path / "steps", "steps") == []
