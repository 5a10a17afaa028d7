"""`toolflash train-draft` end to end on a tiny saved target with a chat tokenizer."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import pytest
from mlx_lm.utils import save_config, save_model

from toolflash.commands import train_draft
from toolflash.engine.draft_loading import TargetInfo, load_draft
from toolflash.engine.factory import load_target

from ..engine.tiny_models import qwen3_target
from .helpers import char_tokenizer


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("target")
    model = qwen3_target()
    save_model(path, model)
    save_config(asdict(model.args), path / "config.json")
    char_tokenizer().save_pretrained(str(path))
    return path


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    train_draft.add_arguments(parser)
    return train_draft.run(parser.parse_args(argv))


def test_train_draft_command(target_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    rows: list[dict[str, object]] = [
        {"messages": [{"role": "user", "content": f"say {w} {i}"}]} for i, w in enumerate(words * 2)
    ]
    rows += [{"prompt": f"def {w}():"} for w in words]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "draft"
    argv = [
        "--target",
        str(target_dir),
        "--data",
        str(data),
        "--out",
        str(out),
        "--steps",
        "12",
        "--batch-size",
        "4",
        "--max-new-tokens",
        "16",
        "--eval-count",
        "4",
        "--eval-max-new-tokens",
        "16",
        "--no-progress",
    ]
    assert _run(argv) == 0

    cfg = json.loads((out / "config.json").read_text())
    tok = char_tokenizer()
    assert cfg["dflash_config"]["mask_token_id"] == tok.convert_tokens_to_ids("<|mask|>")
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 2]
    assert cfg["block_size"] == 8 and cfg["architectures"] == ["DFlashDraftModel"]
    report = json.loads((out / "training_report.json").read_text())
    assert report["data"]["prompts"] == 14  # 18 prompts, 4 held out
    assert report["data"]["distill_batch"] == 64  # batched distillation by default
    assert report["training"]["steps"] == 12
    assert report["evaluation"]["lossless"] is True
    assert set(report["evaluation"]["kinds"]) == {"chat", "text"}
    assert report["evaluation"]["overall"]["tokens_per_cycle"] >= 1.0
    target, _, config = load_target(target_dir)
    load_draft(out, TargetInfo.from_config(config, family=target.family))


def test_train_draft_reports_bad_data(
    target_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--target",
        str(target_dir),
        "--data",
        str(tmp_path / "none"),
        "--out",
        str(tmp_path / "o"),
    ]
    assert _run(argv) == 2
    assert "no training data" in capsys.readouterr().err


def test_distill_batch_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _run(["--target", "t", "--data", "d", "--out", "o", "--distill-batch", "0"])
    assert "must be >= 1" in capsys.readouterr().err
