"""The calibration record (`policy/calibration.py`): round trip, stale and corrupt files, seeding."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import structlog

from toolflash.policy.calibration import (
    CalibrationKey,
    CalibrationRecord,
    load_record,
    record_path,
    records_for,
    save_record,
    seed,
)
from toolflash.policy.estimates import Estimates

KEY = CalibrationKey(
    model="org/target",
    draft="org/target-dflash",
    weights="abc123",
    machine={"system": "Linux", "cpu": "test cpu", "device": "Device(cpu, 0)"},
    mlx="0.32.4",
    mlx_lm="0.32.2",
    toolflash="0.1.0",
)
ROWS = (
    {"row": "timing", "context": 256, "ar_ms": 3.1, "ar_steps": 40, "cycle_ms": {"16": 9.7}},
    {"row": "class", "class": "json.think-off.user.lt1k", "span": "json", "tau": 8.3},
)


def test_record_round_trip(tmp_path: Path) -> None:
    record = CalibrationRecord(KEY, created=1234.5, wall_s=13.6, rows=ROWS)
    path = save_record(tmp_path, record)
    assert path == record_path(tmp_path, KEY) and path.is_file()
    assert load_record(tmp_path, KEY) == record
    assert records_for(tmp_path, KEY.model) == [(path, record)]
    assert records_for(tmp_path, "another/model") == []


def test_a_record_of_another_version_is_ignored_with_a_log_line(tmp_path: Path) -> None:
    save_record(tmp_path, CalibrationRecord(KEY, 1.0, 2.0, ROWS))
    newer = dataclasses.replace(KEY, mlx="0.33.0")
    # The same file (named by model, drafter and machine), found and judged stale.
    assert record_path(tmp_path, newer) == record_path(tmp_path, KEY)
    with structlog.testing.capture_logs() as logs:
        assert load_record(tmp_path, newer) is None
    stale = [e for e in logs if e["event"] == "calibration.stale"]
    assert len(stale) == 1 and stale[0]["changed"] == ["mlx"]
    other_cpu = dataclasses.replace(KEY, machine={**KEY.machine, "cpu": "other"})
    assert KEY.differences(other_cpu) == ["machine.cpu"]


def test_a_corrupt_or_foreign_record_is_ignored_with_a_log_line(tmp_path: Path) -> None:
    path = record_path(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    for text in ('{"format": "toolflash-calibration", "vers', '{"format": "other"}', "[1, 2]"):
        path.write_text(text)
        with structlog.testing.capture_logs() as logs:
            assert load_record(tmp_path, KEY) is None
        assert [e["event"] for e in logs] == ["calibration.corrupt"]
    path.write_text(json.dumps({**CalibrationRecord(KEY, 1.0, 2.0).as_dict(), "rows": 3}))
    assert load_record(tmp_path, KEY) is None
    assert records_for(tmp_path, KEY.model) == []


def test_a_missing_record_is_none_and_saving_to_an_unwritable_place_fails_softly(
    tmp_path: Path,
) -> None:
    assert load_record(tmp_path, KEY) is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    with structlog.testing.capture_logs() as logs:
        assert save_record(blocker, CalibrationRecord(KEY, 1.0, 2.0)) is None
    assert [e["event"] for e in logs] == ["calibration.not_saved"]


def test_seed_caps_the_weights_keeps_the_means_and_other_keys() -> None:
    clock = [1000.0]
    measured = Estimates(clock=lambda: clock[0])
    for i in range(40):
        measured.observe_ar("m", 0.004 + 0.0001 * (i % 3), 300)
        measured.observe_spec("m", "json.x", "json", 16, 7, 0.010, 300, (16, 8))
    target = Estimates(clock=lambda: clock[0])
    target.observe_ar("m", 0.050, 5000)  # another context bucket: kept
    target.observe_ar("m", 0.090, 300)  # the same key: replaced
    n = seed(target, measured, timing_weight=8.0, tau_weight=2.0)
    assert n > 0
    ar = target.ar_s[("m", 512)]
    assert ar.weight == 8.0
    assert abs(ar.mean - measured.ar_s[("m", 512)].mean) < 1e-12
    assert target.ar_s[("m", 8192)].mean == 0.050
    assert target.cycle_s[("m", 16, 512)].weight == 8.0
    # The class's tau is a prior (0 own samples: still probed; own cycles replace it), and
    # the pools priors as ever.
    assert ("m", "json.x", "json", 8) not in target.tau
    tau = target.prior_tau[("m", "json.x", "json", 8)]
    assert tau.weight == 2.0 and tau.mean == 8.0
    assert target.tau[("m", "*", "json", 16)].mean == 8.0
    s = target.surplus("m", "json.x", "json", 16, 300)
    assert s.spec.known and s.ar.known and s.value > 0 and s.tau == 8.0
    assert s.ar.samples == 8.0 and s.spec.samples == 0.0
    assert target.measured_tau("m", "json.x", "json", 16) is None
    target.observe_spec("m", "json.x", "json", 16, 1, 0.010, 300)
    assert target.surplus("m", "json.x", "json", 16, 300).tau == 2.0
