"""Target -> draft resolution and the `toolflash models` listing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from toolflash.commands import models as models_cmd
from toolflash.engine.registry import PAIRS, DraftPair, draft_for, find_pair


@pytest.mark.parametrize(
    ("model", "draft"),
    [
        ("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16"),
        ("mlx-community/Qwen3-4B-4bit", "z-lab/Qwen3-4B-DFlash-b16"),
        ("mlx-community/Qwen3-8B-bf16", "z-lab/Qwen3-8B-DFlash-b16"),
        ("qwen3-8b_mlx", "z-lab/Qwen3-8B-DFlash-b16"),
        ("/models/Qwen3.5-9B-MLX-4bit/", "z-lab/Qwen3.5-9B-DFlash"),
        ("mlx-community/Qwen3.5-35B-A3B-4bit", "z-lab/Qwen3.5-35B-A3B-DFlash"),
        ("Qwen/Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash"),
        ("mlx-community/Qwen3.6-35B-A3B-8bit", "z-lab/Qwen3.6-35B-A3B-DFlash"),
        ("Qwen/Qwen3-40B", None),
        ("Qwen/Qwen3-4", None),
        ("Qwen/Qwen3.5-4Bx", None),
        ("google/gemma-4-31b-it", None),
    ],
)
def test_resolution(model: str, draft: str | None) -> None:
    assert draft_for(model) == draft


def test_longest_match_wins() -> None:
    pairs = (
        DraftPair("Qwen3.5-35B", "z-lab/short", "qwen3_5"),
        DraftPair("Qwen3.5-35B-A3B", "z-lab/long", "qwen3_5"),
    )
    assert find_pair("org/Qwen3.5-35B-A3B-4bit", pairs) == pairs[1]
    assert find_pair("org/Qwen3.5-35B-4bit", pairs) == pairs[0]


def test_registry_families() -> None:
    assert {p.family for p in PAIRS} == {"qwen3", "qwen3_5"}
    assert len({p.target for p in PAIRS}) == len(PAIRS) == 8


def _run(capsys: pytest.CaptureFixture[str], **kw: object) -> tuple[int, str]:
    args = argparse.Namespace(name=None, json=False)
    for k, v in kw.items():
        setattr(args, k, v)
    rc = models_cmd.run(args)
    return rc, capsys.readouterr().out


def test_models_lists_embedded_and_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 4})
    )
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "block_size": 8, "dflash_config": {}})
    )
    monkeypatch.setattr(models_cmd, "TINY_ROOT", tmp_path)
    rc, out = _run(capsys)
    assert rc == 0
    assert "none built" not in out
    lines = out.splitlines()
    assert any(line.split()[:3] == ["draft", "draft", "qwen3"] for line in lines)
    assert any(line.split()[:5] == ["target", "target", "qwen3", "64", "4"] for line in lines)
    assert any("mlx-community/Qwen3-4B-4bit" in line for line in lines)
    assert sum("z-lab/" in line for line in lines) == len(PAIRS)

    rc, out = _run(capsys, json=True)
    data = json.loads(out)
    assert [m["role"] for m in data["embedded"]] == ["draft", "target"]
    assert data["embedded"][0]["block_size"] == 8
    assert len(data["pairs"]) == len(PAIRS)


def test_models_none_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(models_cmd, "TINY_ROOT", tmp_path / "absent")
    rc, out = _run(capsys)
    assert rc == 0 and "none built" in out


def test_models_resolves_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run(capsys, name="mlx-community/Qwen3-4B-4bit")
    assert rc == 0 and "z-lab/Qwen3-4B-DFlash-b16" in out
    rc, out = _run(capsys, name="meta-llama/Llama-3.1-8B", json=True)
    assert rc == 1 and json.loads(out)["pair"] is None
