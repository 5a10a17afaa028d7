"""Persistence of learned estimates: round trip, other models kept, corrupt and foreign files."""

from __future__ import annotations

import json
from pathlib import Path

from toolflash.policy.estimates import Estimates
from toolflash.policy.store import FORMAT, PolicyStore

from .fakes import FakeClock


def learned(clock: FakeClock, model: str = "m") -> Estimates:
    est = Estimates(clock=clock)
    for _ in range(5):
        est.observe_spec(model, "tools.think-off.user.lt1k", "tool_call", 8, 1, 0.02, 400)
        est.observe_ar(model, 0.006, 400)
        est.observe_forced(model, "tools.think-off.user.lt1k", "tool_call", 6, 0.012, block_size=8)
    return est


def test_round_trip_keeps_other_models(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "state" / "policy-state.json"
    store = PolicyStore(path)
    assert store.save("m", learned(clock))
    assert store.save("other", learned(clock, "other"))
    fresh = Estimates(clock=clock)
    # 3 tau pools, cycle (the model's and the class's), AR; forced share (2 sums), forced
    # seconds and tokens per cycle
    assert store.load("m", fresh) == 10
    assert fresh.forced_share("m", "tools.think-off.user.lt1k", "tool_call") > 0
    surplus = fresh.surplus("m", "tools.think-off.user.lt1k", "tool_call", 8, 400)
    assert surplus == learned(clock).surplus("m", "tools.think-off.user.lt1k", "tool_call", 8, 400)
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT and set(doc["models"]) == {"m", "other"}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".policy-state.")]


def test_corrupt_foreign_and_missing_files_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "policy-state.json"
    est = Estimates(clock=FakeClock())
    assert PolicyStore(path).load("m", est) == 0  # missing
    for text in (
        "{not json",
        json.dumps({"format": "something-else", "version": 1, "models": {}}),
        json.dumps([1, 2]),
        json.dumps({"format": FORMAT, "version": 1, "models": {"m": {"tau": [["bad"]]}}}),
        json.dumps({"format": FORMAT, "version": 1, "models": {"m": "x"}}),
    ):
        path.write_text(text)
        assert PolicyStore(path).load("m", est) == 0
        assert not est.tau and not est.ar_s
    # A corrupt file is replaced by a good one on the next save.
    path.write_text("{not json")
    assert PolicyStore(path).save("m", learned(FakeClock()))
    assert PolicyStore(path).load("m", Estimates(clock=FakeClock())) == 10


def test_unwritable_state_dir_does_not_raise(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not PolicyStore(blocker / "sub" / "policy-state.json").save("m", learned(FakeClock()))


def test_saved_counts_and_forget_removes_one_model_or_all(tmp_path: Path) -> None:
    clock = FakeClock()
    store = PolicyStore(tmp_path / "policy-state.json")
    assert store.saved() == {} and store.forget("m") == []  # no file yet
    store.save("m", learned(clock))
    store.save("other", learned(clock, "other"))
    fresh = Estimates(clock=clock)
    assert store.saved() == {"m": store.load("m", fresh), "other": 10}
    assert store.forget("absent") == []
    assert store.forget("m") == ["m"]
    assert store.saved() == {"other": 10} and store.load("m", Estimates(clock=clock)) == 0
    store.save("m", learned(clock))
    assert store.forget() == ["m", "other"] and store.saved() == {}
