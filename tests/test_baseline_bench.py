"""`toolflash bench --baseline mlx-lm`: every variant decodes exactly what mlx-lm's
`generate_step` decodes on the embedded pair, in both stop modes, and the report holds a row
per (stop, kind, variant) with the baseline at 1.00x (correctness only; no timed asserts)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolflash.baseline_bench import (
    BASELINE,
    VARIANTS,
    format_comparison,
    mlx_lm_run,
    plot_comparison,
    run_comparison,
)
from toolflash.bench import load_prompts
from toolflash.engine.factory import assets_dir, build_engine


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    engine = build_engine()
    prompts = load_prompts(str(assets_dir() / "bench_prompts.jsonl"))
    one_each = list({p.kind: p for p in prompts}.values())
    return run_comparison(engine, one_each, max_tokens=24, repeats=1, progress=False)


def test_every_variant_is_identical_to_mlx_lm(report: dict[str, Any]) -> None:
    assert report["variants"] == list(VARIANTS)
    for row in report["rows"]:
        assert row["identical"] == row["runs"] > 0, row


def test_a_row_per_stop_kind_and_variant(report: dict[str, Any]) -> None:
    kinds = {"free_text", "code", "tool_call", "json", "all"}
    keys = {(r["stop"], r["kind"], r["variant"]) for r in report["rows"]}
    assert keys == {(s, k, v) for s in ("eos", "length") for k in kinds for v in VARIANTS}
    for row in report["rows"]:
        if row["variant"] == BASELINE:
            assert row["ratio"] == pytest.approx(1.0)
        if row["stop"] == "length":  # EOS ignored: every run decodes max_tokens
            assert row["tokens"] == row["runs"] * 23


def test_phase_split_and_outputs(report: dict[str, Any], tmp_path: Path) -> None:
    phases = report["phases"]
    assert {p["kind"] for p in phases} == {"free_text", "code", "tool_call", "json"}
    for p in phases:
        assert p["draft_ms"] > 0 and p["verify_ms"] > 0
        assert p["draft"] + p["verify"] + p["overhead"] == pytest.approx(1.0, abs=1e-3)
    text = format_comparison(report)
    assert "stop=eos" in text and "stop=length" in text and "overhead" in text
    assert plot_comparison(report, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_mlx_lm_run_stops_at_eos_and_keeps_it() -> None:
    engine = build_engine()
    prompt = engine.encode_chat([{"role": "user", "content": "Say hi."}])
    full = mlx_lm_run(engine.target.model, prompt, 64, frozenset()).tokens
    eos = next((t for t in full if t in engine.eos_ids), None)
    if eos is None:
        pytest.skip("the model did not end within 64 tokens")
    cut = mlx_lm_run(engine.target.model, prompt, 64, engine.eos_ids).tokens
    assert cut == full[: full.index(eos) + 1]


def test_policy_rows_take_extra_policy_files(tmp_path: Path) -> None:
    """`--policy-config`: the policy rows' fresh policies apply the files after the shipped
    ones, as serve does."""
    from toolflash.baseline_bench import calibrated_policies
    from toolflash.policy.config import PolicyConfig

    engine = build_engine()
    shipped = PolicyConfig().for_model(engine.model_id).data.exploration.probe_share
    extra = tmp_path / "probe.yaml"
    extra.write_text(f"exploration:\n  probe_share: {1.0 if shipped != 1.0 else 0.5}\n")
    fresh = calibrated_policies(engine, False, [str(extra)])
    policy = fresh()
    got = policy.config.for_model(engine.model_id).data.exploration.probe_share
    assert got != shipped and got in (1.0, 0.5)
    assert fresh() is not policy  # a fresh policy each time, the same files


def test_policy_rows_reuse_a_calibration_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--calibration-dir`: the first run measures into it, a later run reuses it unmeasured
    even where a server would calibrate again (here: its record gone; another tree's copy of
    the weights makes it stale alike), and both runs' fresh policies start from the same
    estimates."""
    import toolflash.calibrate as calibrate
    from toolflash.baseline_bench import calibrated_policies

    measured = []
    run_calibration = calibrate.run_calibration

    def counting(*args: Any, **kwargs: Any) -> Any:
        measured.append(1)
        return run_calibration(*args, **kwargs)

    monkeypatch.setattr(calibrate, "run_calibration", counting)
    engine = build_engine()
    first = calibrated_policies(engine, False, (), str(tmp_path / "cal"))
    for record in (tmp_path / "cal" / "calibration").glob("*.json"):
        record.unlink()
    second = calibrated_policies(engine, False, (), str(tmp_path / "cal"))
    assert measured == [1]

    def entries(fresh: Callable[[], Any]) -> dict[str, list[list[Any]]]:
        return fresh().model(engine.model_id).estimates.to_json()

    assert entries(first) == entries(second)
