"""One decision record: the response's `toolflash.decisions` are the adaptive controller's own
records (step, mode, block, reason, span kind, decision kind), not a second log of them."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.conftest import serve
from tests.gateway.fake_engine import FakeEngine
from toolflash.gateway.prepare import ControllerRequest
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig
from toolflash.policy.controller import PolicyController
from toolflash.policy.record import DecisionRecord, RecordingController, recording


def test_the_response_serves_the_controllers_records(tmp_path: Path) -> None:
    policy = AdaptivePolicy(PolicyConfig(), persist=False)
    made: list[PolicyController] = []

    def factory(req: ControllerRequest) -> PolicyController:
        ctrl = policy.controller_for(req.model_id, req.request_class, req.response_format_json)
        made.append(ctrl)
        return ctrl

    with serve(FakeEngine(), app_kwargs={"controller_factory": factory}) as s:
        r = s.client().chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "SCRIPT:" + "Plain text that goes on. " * 4}],
        )
    tf = r.model_extra["toolflash"]  # type: ignore[index]
    records = made[0].records
    assert records and records[0].kind == "start" and records[0].span == "text"
    assert tf["decisions"] == [
        {
            "cycle": rec.step,
            "mode": rec.mode,
            "block_size": rec.block_size,
            "reason": rec.reason,
            "span": rec.span,
            "kind": rec.kind,
        }
        for rec in records
    ]


class _Scripted:
    """A controller that keeps no records: spec, then AR from the third step."""

    def prepare(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> None:
        pass

    def observe_prefix(self, text: str) -> None:
        pass

    def start(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0):  # type: ignore[no-untyped-def]
        from toolflash.engine.api import ModeDecision

        return ModeDecision("spec", default_block_size, "start")

    def after_step(self, record, token_ids, text):  # type: ignore[no-untyped-def]
        from toolflash.engine.api import ModeDecision

        if record.index >= 2:
            return ModeDecision("ar", 1, "slow")
        return ModeDecision("spec", record.block_size, "keep")

    def finish(self, stats) -> None:  # type: ignore[no-untyped-def]
        pass


def test_recording_wraps_only_controllers_without_records(tmp_path: Path) -> None:
    policy = AdaptivePolicy(PolicyConfig(), persist=False)
    from toolflash.policy.request_class import RequestClass

    ctrl = policy.controller_for("m", RequestClass("chat", "off", False, "lt1k"), False)
    assert recording(ctrl) is ctrl
    wrapped = recording(_Scripted())
    assert isinstance(wrapped, RecordingController)
    from tests.policy.fakes import spec_record

    wrapped.start(300, 8)
    for i in range(4):
        wrapped.after_step(spec_record(i, 8, 3, 0.01), [0] * 4, "w")
    assert wrapped.records == [
        DecisionRecord(0, "spec", 8, "start"),
        DecisionRecord(3, "ar", None, "slow"),
    ]
