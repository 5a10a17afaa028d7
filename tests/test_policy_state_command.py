"""`toolflash policy show` says what the policy learned and where; `toolflash policy reset`
forgets it for one model or all; `--state-dir` moves it (serve, calibrate, policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolflash.cli import build_parser
from toolflash.commands import policy as policy_command
from toolflash.commands import serve
from toolflash.policy.calibration import (
    CalibrationKey,
    CalibrationRecord,
    record_dir,
    records_for,
    save_record,
)
from toolflash.policy.estimates import Estimates
from toolflash.policy.store import PolicyStore


def run(*argv: str) -> int:
    args = build_parser().parse_args(["policy", *argv])
    return int(policy_command.run(args))


def learn(state_dir: Path, *models: str) -> PolicyStore:
    store = PolicyStore(state_dir / "policy-state.json")
    for model in models:
        est = Estimates()
        est.observe_ar(model, 0.006, 400)
        assert store.save(model, est)
        key = CalibrationKey(model=model, draft="d", weights="w")
        assert save_record(state_dir, CalibrationRecord(key, created=0.0, wall_s=1.0, rows=()))
    return store


def records(state_dir: Path) -> list[str]:
    return sorted(r.key.model for m in "abc" for _, r in records_for(state_dir, m))


def test_show_reports_the_state_file_and_what_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("show", "--model", "a", "--state-dir", str(tmp_path)) == 0
    assert (
        f"# learned: nothing for a in {tmp_path / 'policy-state.json'}" in capsys.readouterr().out
    )
    learn(tmp_path, "a", "b")
    assert run("show", "--model", "a", "--state-dir", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "# learned: 1 estimate rows for a in" in out and "also b (1)" in out
    assert f"# calibration: {record_dir(tmp_path)}" in out and "draft d" in out


def test_reset_forgets_one_model_or_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = learn(tmp_path, "a", "b", "c")
    assert run("reset", "--model", "a", "--state-dir", str(tmp_path)) == 0
    assert "forgot a" in capsys.readouterr().out
    assert set(store.saved()) == {"b", "c"}
    assert records(tmp_path) == ["b", "c"]
    assert run("reset", "--model", "a", "--state-dir", str(tmp_path)) == 0
    assert "nothing learned for a" in capsys.readouterr().out
    assert run("reset", "--state-dir", str(tmp_path)) == 0
    assert store.saved() == {} and records(tmp_path) == []


def test_serve_state_dir_moves_the_policy_state(tmp_path: Path) -> None:
    p = build_parser()
    args = p.parse_args(["serve", "--state-dir", str(tmp_path / "s")])
    policy = serve._policy(args)
    assert policy.model("m").store.path == tmp_path / "s" / "policy-state.json"
    plan = serve.startup_plan(serve.serve_settings(args), serve.config_from_args(args), policy)
    assert plan["policy_state"] == str(tmp_path / "s" / "policy-state.json")
    assert plan["decoding"].startswith("adaptive policy")
    off = p.parse_args(["serve", "--policy", "off", "--mode", "ar"])
    plan = serve.startup_plan(serve.serve_settings(off), serve.config_from_args(off), None)
    assert plan["decoding"] == "ar on every request (--policy off)" and "policy_state" not in plan
