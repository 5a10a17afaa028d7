"""`toolflash doctor` on tiny model directories written in tmp."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models import qwen3
from tokenizers import Tokenizer, models, pre_tokenizers

from toolflash.commands import doctor
from toolflash.commands import models as models_cmd
from toolflash.engine.draft_loading import save_draft
from toolflash.engine.drafter import DFlashDrafter, DraftConfig

TARGET_CFG: dict[str, Any] = {
    "model_type": "qwen3",
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-6,
    "vocab_size": 96,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


def write_tokenizer(path: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary, loadable by mlx-lm."""
    vocab = {f"w{i}": i for i in range(94)} | {"<unk>": 94, "<|endoftext|>": 95}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "unk_token": "<unk>",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def write_target(path: Path, tokenizer: bool = True, **overrides: Any) -> Path:
    cfg = {**TARGET_CFG, **overrides}
    path.mkdir(parents=True)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(cfg))
    mx.eval(model.parameters())
    model.save_weights(str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    if tokenizer:
        write_tokenizer(path)
    return path


def write_draft(path: Path, **overrides: Any) -> Path:
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "vocab_size": 96,
        "block_size": 4,
        "num_target_layers": 4,
        "dflash_config": {"mask_token_id": 95, "target_layer_ids": [1, 2]},
        **overrides,
    }
    return save_draft(DFlashDrafter(DraftConfig.from_dict(cfg)), path)


def run_doctor(
    capsys: pytest.CaptureFixture[str], model: str | None = None, draft: str | None = None
) -> tuple[int, dict[str, Any], dict[str, dict[str, str]]]:
    args = argparse.Namespace(json=True, model=model, draft=draft, no_bench=True)
    rc = doctor.run(args)
    report = json.loads(capsys.readouterr().out)
    return rc, report, {c["name"]: c for c in report["checks"]}


@pytest.fixture(autouse=True)
def no_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models_cmd, "TINY_ROOT", tmp_path / "no-assets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def test_reports_environment(capsys: pytest.CaptureFixture[str]) -> None:
    rc, report, checks = run_doctor(capsys)
    assert rc == 0 and report["ok"] is True
    assert report["mlx"]["default_device"] in {"cpu", "gpu"}
    assert report["blas"]["name"] in {"openblas", "reference", "mkl", "blis", "accelerate"}
    assert report["versions"]["mlx-lm"] and report["versions"]["huggingface-hub"]
    assert checks["embedded"]["status"] == "warn" and "none built" in checks["embedded"]["detail"]
    assert checks["mlx"]["status"] == "ok"


def test_model_and_draft_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = write_target(tmp_path / "target")
    draft = write_draft(tmp_path / "draft")
    rc, _, checks = run_doctor(capsys, str(target), str(draft))
    assert rc == 0
    assert checks["model"]["status"] == "ok" and "family qwen3" in checks["model"]["detail"]
    assert checks["draft"]["status"] == "ok" and "block 4" in checks["draft"]["detail"]


def test_mismatched_draft_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = write_target(tmp_path / "target")
    draft = write_draft(tmp_path / "draft", hidden_size=48)
    rc, _, checks = run_doctor(capsys, str(target), str(draft))
    assert rc == 1
    assert checks["model"]["status"] == "ok"
    assert checks["draft"]["status"] == "fail"
    assert "hidden_size 48 does not match" in checks["draft"]["detail"]


def test_unsupported_family_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "llama"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**TARGET_CFG, "model_type": "llama"}))
    rc, _, checks = run_doctor(capsys, str(path))
    assert rc == 1
    assert "model_type 'llama' is not supported" in checks["model"]["detail"]


def test_target_with_wrong_weights_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_target(tmp_path / "target")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "hidden_size": 64}))
    rc, _, checks = run_doctor(capsys, str(path))
    assert rc == 1 and checks["model"]["status"] == "fail"


def test_missing_model_offline(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, checks = run_doctor(capsys, "nobody/absent-model", "nobody/absent-draft")
    assert rc == 1
    assert "neither a local directory nor cached" in checks["model"]["detail"]
    assert checks["draft"]["status"] == "fail"


def test_published_pair_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = write_target(tmp_path / "Qwen3-4B-4bit")
    rc, _, checks = run_doctor(capsys, str(target))
    assert rc == 0 and "z-lab/Qwen3-4B-DFlash-b16" in checks["draft"]["detail"]


def test_draft_without_model_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = write_draft(tmp_path / "draft")
    rc, _, checks = run_doctor(capsys, draft=str(draft))
    assert rc == 0 and checks["draft"]["status"] == "warn"


def test_embedded_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "tiny"
    write_target(root / "target")
    write_draft(root / "draft")
    monkeypatch.setattr(models_cmd, "TINY_ROOT", root)
    rc, report, checks = run_doctor(capsys)
    assert rc == 0
    assert checks["embedded:target"]["status"] == "ok"
    assert checks["embedded:draft"]["status"] == "ok"
    assert checks["engine"]["status"] == "ok", checks["engine"]
    assert {m["role"] for m in report["embedded"]} == {"target", "draft"}

    (root / "draft" / "model.safetensors").unlink()
    rc, _, checks = run_doctor(capsys)
    assert rc == 1 and checks["embedded:draft"]["status"] == "fail"
    assert "engine" not in checks


def test_embedded_pair_by_its_served_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "tiny"
    write_target(root / "qwen3-tiny")
    write_draft(root / "qwen3-tiny-dflash")
    monkeypatch.setattr(models_cmd, "TINY_ROOT", root)
    rc, _, checks = run_doctor(capsys, "toolflash-tiny-qwen3")
    assert rc == 0
    assert checks["model"]["status"] == "ok" and "family qwen3" in checks["model"]["detail"]
    assert checks["draft"]["status"] == "ok" and "block 4" in checks["draft"]["detail"]


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc = doctor.run(argparse.Namespace(json=False, model=None, draft=None, no_bench=False))
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("toolflash doctor")
    assert "GFLOP/s" in out and "float32" in out and "bfloat16" in out


def test_the_engine_check_builds_the_pair_serve_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both embedded pairs present: the engine check builds the default one (the qwen35 pair),
    not the first found."""
    root = tmp_path / "tiny"
    for name, layers in (("qwen3-tiny", 4), ("qwen35-tiny", 5)):  # a draft finds its target
        write_target(root / name, num_hidden_layers=layers)
        write_draft(root / f"{name}-dflash", num_target_layers=layers)
    monkeypatch.setattr(models_cmd, "TINY_ROOT", root)
    rc, _, checks = run_doctor(capsys)
    assert rc == 0
    detail = checks["engine"]["detail"]
    assert "qwen35-tiny + qwen35-tiny-dflash" in detail and "toolflash-tiny-qwen35" in detail


def test_reports_what_the_policy_learned_and_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolflash.policy.estimates import Estimates
    from toolflash.policy.store import PolicyStore

    args = argparse.Namespace(json=True, model=None, draft=None, no_bench=True)
    args.state_dir = str(tmp_path / "state")
    assert doctor.run(args) == 0
    check = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}["policy"]
    assert "nothing learned yet" in check["detail"] and str(tmp_path / "state") in check["detail"]
    est = Estimates()
    est.observe_ar("some-model", 0.006, 400)
    PolicyStore(tmp_path / "state" / "policy-state.json").save("some-model", est)
    assert doctor.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy_state"]["estimate_rows"] == {"some-model": 1}
    assert "some-model (1 rows)" in {c["name"]: c for c in report["checks"]}["policy"]["detail"]


def test_prints_only_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Loading the models logs (engine lines at info, a warning for a pair without a drafter)
    and may print: none of it reaches stdout or stderr, even at debug level."""
    import structlog

    from toolflash.gateway.logs import configure_logging

    root = tmp_path / "tiny"
    write_target(root / "target")
    write_draft(root / "draft")
    monkeypatch.setattr(models_cmd, "TINY_ROOT", root)
    configure_logging(json_lines=False, level="debug")  # as the CLI does, to stderr
    try:
        structlog.get_logger("toolflash.engine.factory").info("before")  # a logger in use
        capsys.readouterr()
        rc = doctor.run(argparse.Namespace(json=False, model=None, draft=None, no_bench=True))
        out, err = capsys.readouterr()
    finally:
        structlog.reset_defaults()
    assert rc == 0 and out.startswith("toolflash doctor") and "engine builds" in out
    assert err == ""
    assert all(line.startswith(("toolflash doctor", "  ")) for line in out.splitlines())
