"""`benchmarks/agent_workload.py`: the data files load into chat completions bodies the server
accepts, the edit sessions really copy their context, every strategy's greedy output equals
AR's (with and without a drafter), and the report has its fields (correctness only; no timed
asserts)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import agent_workload as aw  # noqa: E402
from agent_workload_data import (  # noqa: E402
    WorkloadDataError,
    load_sessions,
    turn_bodies,
)
from agent_workload_report import format_report, load_report, plot, save_report  # noqa: E402

from toolflash.gateway.protocol import ChatCompletionRequest  # noqa: E402

# Small sessions that still cover a tool-result turn, a forced call and a JSON answer.
FEW = ["add-test", "forced-edit", "routes-json"]


def test_loader_reads_every_session_as_valid_request_bodies() -> None:
    sessions = load_sessions()
    names = [s.name for s in sessions]
    assert len(names) == len(set(names)) >= 24
    bodies = [t.body for s in sessions for t in turn_bodies(s, "m", 32)]
    assert len(bodies) == sum(len(s.turns) for s in sessions)
    for body in bodies:
        req = ChatCompletionRequest.model_validate(body)
        assert req.temperature == 0.0 and req.max_tokens == 32
        assert req.messages[0].role == "system" and req.messages[-1].role != "assistant"
        for m in body["messages"]:
            for call in m.get("tool_calls") or []:
                assert isinstance(call["function"]["arguments"], str)  # as on the wire
    # Every kind of request the workload is for.
    assert any(b.get("tool_choice") == "required" for b in bodies)
    assert {b["response_format"]["type"] for b in bodies if "response_format" in b} == {
        "json_object",
        "json_schema",
    }
    assert {b.get("chat_template_kwargs", {}).get("enable_thinking") for b in bodies} >= {
        True,
        False,
    }


def test_edit_sessions_copy_what_an_earlier_tool_result_holds() -> None:
    """The turns lookup is for: an edit's old text, a rewritten file's unchanged lines and a
    read's path come from the conversation before the call."""
    copied = 0
    for s in load_sessions():
        seen = s.system
        for m in s.messages:
            for call in m.get("tool_calls") or []:
                args = call["function"]["arguments"]
                if "old_string" in args:
                    assert args["old_string"] in seen, (s.name, args)
                    copied += 1
                if call["function"]["name"] == "write_file" and "\n" in args["content"]:
                    lines = args["content"].splitlines()
                    same = sum(1 for line in lines if line in seen)
                    copied += same >= len(lines) - 1
            seen += "\n".join(_texts(m))
    assert copied >= 5


def _texts(value: Any) -> list[str]:
    """Every string in a message, JSON tool results decoded."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return [value]
        return [value, *_texts(decoded)] if not isinstance(decoded, str) else [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def test_loader_refuses_bad_data(tmp_path: Path) -> None:
    (tmp_path / "tools.json").write_text(json.dumps({"t": []}))
    good = {"name": "a", "system": "s", "tools": "t", "messages": [{"role": "assistant"}]}
    (tmp_path / "a.jsonl").write_text(json.dumps(good) + "\n")
    assert [s.name for s in load_sessions(tmp_path)] == ["a"]
    with pytest.raises(WorkloadDataError, match="no session named b"):
        load_sessions(tmp_path, ["b"])
    (tmp_path / "b.jsonl").write_text(json.dumps({**good, "name": "b", "tools": "x"}) + "\n")
    with pytest.raises(WorkloadDataError, match="b.jsonl:1: unknown tool set 'x'"):
        load_sessions(tmp_path)
    (tmp_path / "b.jsonl").write_text(json.dumps({"name": "b", "messages": []}) + "\n")
    with pytest.raises(WorkloadDataError, match="missing field 'system'"):
        load_sessions(tmp_path)
    (tmp_path / "b.jsonl").write_text(json.dumps({**good, "messages": [{"role": "user"}]}))
    with pytest.raises(WorkloadDataError, match="no assistant turn"):
        load_sessions(tmp_path)


def _run(*extra: str) -> dict[str, Any]:
    args = aw.parse_args(
        ["--rounds", "1", "--max-tokens", "12", "--short-repeats", "1", "--sessions", *FEW]
        + list(extra)
    )
    return aw.run(args)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return _run()


@pytest.fixture(scope="module")
def report_no_drafter(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    variant = tmp_path_factory.mktemp("variant") / "model_timing.yaml"
    variant.write_text("estimates:\n  timing_scope: model\n")
    return _run("--no-drafter", "--variant", f"model={variant}")


def test_every_strategy_decodes_what_ar_decodes(report: dict[str, Any]) -> None:
    assert report["strategies"] == [
        "mlx-lm",
        "ar",
        "spec",
        "lookup",
        "policy-2arm",
        "policy-3arm",
        "ar-again",
    ]
    assert report["outputs_identical"]
    requests = sum(len(s.turns) for s in load_sessions(names=FEW))
    assert report["requests"] == requests
    for strategy, counts in report["outputs"].items():
        assert counts["runs"] == requests, strategy
        if strategy != "mlx-lm":
            assert counts["identical_to_ar"] == counts["runs"], strategy
    # Unconstrained requests: plain mlx-lm decodes the same tokens as well.
    free = [
        r for r in report["rows"] if r["strategy"] == "mlx-lm" and r["class"].startswith("tools.")
    ]
    assert free and all(r["same_as_ar"] for r in free)


def test_lookup_and_policy_arms_ran(report: dict[str, Any]) -> None:
    rows = report["rows"]
    lookup = [r for r in rows if r["strategy"] == "lookup"]
    assert all(r["arm_steps"].keys() == {"lookup"} for r in lookup)
    assert all(r["lookup_steps"] == r["cycles"] for r in lookup)
    assert all("lookup" not in r["arm_steps"] for r in rows if r["strategy"] == "policy-2arm")
    assert all(r["policy"] is not None for r in rows if r["strategy"].startswith("policy"))
    assert set(report["lookup"]["lookup"]) >= {"overall"}


def test_report_fields(report: dict[str, Any], tmp_path: Path) -> None:
    assert set(report["measures"]) == {"wall_median", "wall_paired", "cpu_median", "wall_all_runs"}
    m = report["measures"]["wall_median"]
    classes = {r["class"] for r in report["rows"]}
    assert set(m["tok_s"]) == classes | {"overall"}
    for group, ratio in m["vs_mlx_lm"].items():
        assert ratio["mlx-lm"] == pytest.approx(1.0), group
        assert set(ratio) == set(report["strategies"])
        assert set(m["vs_best_arm"][group]) == {"policy-2arm", "policy-3arm"}
    assert {"three_vs_two_arm_overall", "three_vs_two_arm_met"} <= set(m["targets"])
    assert "noise" in format_report(report)
    plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    save_report(report, tmp_path / "r.json.gz")  # what main writes
    assert load_report(tmp_path / "r.json.gz") == json.loads(json.dumps(report))
    (tmp_path / "old.json").write_text(json.dumps(report, indent=1))  # earlier runs' files
    assert load_report(tmp_path / "old.json") == load_report(tmp_path / "r.json.gz")


def test_no_drafter_runs_ar_lookup_and_the_policy(report_no_drafter: dict[str, Any]) -> None:
    rep = report_no_drafter
    assert rep["draft"] is None
    assert rep["strategies"] == ["mlx-lm", "ar", "lookup", "policy", "policy@model", "ar-again"]
    assert rep["outputs_identical"]
    policies = ("policy", "policy@model")
    assert all(
        set(r["arm_steps"]) <= {"ar", "lookup"} for r in rep["rows"] if r["strategy"] in policies
    )
    m = rep["measures"]["wall_median"]
    assert all(set(v) == set(policies) for v in m["vs_best_arm"].values())
    targets = rep["measures"]["wall_median"]["targets"]
    assert {"lookup_at_least_mlx_lm_every_class", "policy_at_least_mlx_lm_every_class"} <= set(
        targets
    )
