"""Policy files: shipped files valid, merging by model pattern, class/span resolution, errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from toolflash.commands import policy as policy_command
from toolflash.policy.config import (
    PolicyConfig,
    PolicyFileError,
    load_policy_file,
    matches_model,
    shipped_files,
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_files_load_and_default_comes_first() -> None:
    names = [n for n, _ in shipped_files()]
    assert names[0] == "default.yaml" and "toolflash-tiny-qwen3.yaml" in names
    config = PolicyConfig()
    tiny = config.for_model("toolflash-tiny-qwen3")
    other = config.for_model("Qwen/Qwen3-4B")
    # The tiny pair's drafter proposes blocks of 16: the per-model file keeps 16 a choice ...
    assert tiny.rule("chat.think-off.user.lt1k", "text").block_sizes == (16, 8, 4)
    assert other.rule("chat.think-off.user.lt1k", "text").block_sizes == (16, 8, 4)
    # ... and only loosens the margin for forced tool calls and JSON answers.
    assert tiny.rule("json.think-off.user.lt1k", "json").switch_margin == 0.03
    assert tiny.rule("tool-forced.think-off.user.lt1k", "tool_call").switch_margin == 0.03
    assert other.rule("json.think-off.user.lt1k", "json").switch_margin == 0.05
    assert len(tiny.sources) == 2 and len(other.sources) == 1


def test_user_file_overrides_by_model_and_specificity(tmp_path: Path) -> None:
    user = write(
        tmp_path,
        "mine.yaml",
        """
models: ["Qwen/*"]
defaults: {switch_margin: 0.1}
classes:
  "*":
    tool_call: {mode: ar}
  "tools.*":
    "*": {mode: spec, block_sizes: [8]}
  "tools.*.lt1k":
    tool_call: {mode: adaptive}
""",
    )
    config = PolicyConfig([user])
    p = config.for_model("Qwen/Qwen3-4B")
    assert p.rule("chat.think-off.user.lt1k", "tool_call").mode == "ar"
    assert p.rule("chat.think-off.user.lt1k", "text").mode == "adaptive"
    tools_text = p.rule("tools.think-off.user.lt4k", "text")
    assert tools_text.mode == "spec" and tools_text.block_sizes == (8,)
    assert tools_text.switch_margin == 0.1
    assert p.rule("tools.think-off.user.lt4k", "tool_call").mode == "spec"  # tools.* wins over *
    assert p.rule("tools.think-on.user.lt1k", "tool_call").mode == "adaptive"  # most specific
    assert config.for_model("other").rule("chat.x", "tool_call").mode == "adaptive"
    assert "state_dir" in p.to_yaml() and "Qwen/Qwen3-4B" in p.to_yaml()
    assert "# request-class labels: {chat|tools|tools-strict|tool-forced|json}[.sampled]" in (
        p.to_yaml()
    )


def test_model_patterns_match_ids_and_paths() -> None:
    assert matches_model(["*qwen3-tiny*"], "/models/zoo/qwen3-tiny")
    assert matches_model(["qwen3-tiny"], "/models/zoo/qwen3-tiny/")
    assert not matches_model(["Qwen/*"], "mlx-community/Qwen3-4B")


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("defaults:\n  block_sizes: [1, 8]\n", "defaults.block_sizes", "between 2 and 64"),
        ("defaults:\n  mode: fast\n", "defaults.mode", "'adaptive', 'spec', 'ar' or 'lookup'"),
        (
            "classes:\n  'tools.*':\n    tool_cal: {mode: ar}\n",
            "classes.tools.*.tool_cal",
            "'tool_call'",
        ),
        ("exploration:\n  probe_budget: 3\n", "exploration.probe_budget", "Extra inputs"),
        ("defaults:\n  min_confidence: 0.3\n", "defaults.min_confidence", "greater than 0.5"),
        ("estimates:\n  smallest_bucket: 300\n", "estimates.smallest_bucket", "power of two"),
        ("- a\n- b\n", "(document)", "mapping"),
        ("models: [\n", "line 2", "not valid YAML"),
    ],
)
def test_bad_files_name_file_field_and_reason(
    tmp_path: Path, text: str, field: str, reason: str
) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(PolicyFileError) as info:
        load_policy_file(path)
    err = info.value
    assert err.file == str(path)
    assert err.field.startswith(field), err.field
    assert reason in err.reason
    with pytest.raises(PolicyFileError):
        PolicyConfig([path])  # fails at load, not at first use


def test_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="nope.yaml: \\(file\\)"):
        load_policy_file(tmp_path / "nope.yaml")


def test_policy_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "good.yaml", "models: ['x*']\ndefaults: {min_samples: 5}\n")
    bad = write(tmp_path, "bad.yaml", "defaults: {min_samples: -1}\n")
    ns = argparse.Namespace
    assert policy_command.run(ns(policy_command="check", file=str(good))) == 0
    assert policy_command.run(ns(policy_command="check", file=str(bad))) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "defaults.min_samples" in err and "greater than or equal" in err
    assert policy_command.run(ns(policy_command="show", model="xyz", config=[str(good)])) == 0
    out = capsys.readouterr().out
    assert "min_samples: 5.0" in out and "- xyz" in out
