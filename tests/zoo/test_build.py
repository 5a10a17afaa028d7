"""`build_family` runs a recipe end to end, and the same recipe and seed give the same files."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from toolflash.commands import zoo as zoo_command
from toolflash.zoo.build import build_family
from toolflash.zoo.manifest import compare_families, family_files
from toolflash.zoo.recipes import CPU, RECIPES, DrafterRecipe, FamilyRecipe, TargetRecipe

from .test_train_target import SMALL

TEST_RECIPE = FamilyRecipe(
    name="test",
    summary="test-size family: every stage in seconds",
    corpus_size=150_000,
    targets={
        family: TargetRecipe(  # type: ignore[misc]
            steps=12, batch_size=4, seq_len=64, lr=3e-3, config_overrides=SMALL[family]
        )
        for family in ("qwen3", "qwen3_5")
    },
    drafters={
        family: DrafterRecipe(  # type: ignore[misc]
            pool=8,
            steps=4,
            batch_size=4,
            max_new_tokens=12,
            max_prompt_tokens=768,
            target_layer_ids=None,
            distill_batch=4,
            eval_per_kind=1,
        )
        for family in ("qwen3", "qwen3_5")
    },
)

SHIPPED_FILES = ("model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja")


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.name in SHIPPED_FILES or p.name.startswith("prompts_")
    }


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same recipe and seed built twice, the families in two worker processes."""
    roots = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    for root in roots:
        build_family(root, TEST_RECIPE, seed=3, jobs=2)
    return roots


def test_recipe_builds_every_stage(two_builds: tuple[Path, Path]) -> None:
    from toolflash.engine.draft_loading import TargetInfo, load_draft
    from toolflash.engine.factory import load_target

    root = two_builds[0]
    summary = json.loads((root / "build.json").read_text())
    assert summary["recipe"]["name"] == "test"
    assert set(summary["stage_seconds"]) == {
        "corpus", "tokenizer", "tokenize", "train_qwen3", "train_qwen3_5",
        "prompts_qwen3", "prompts_qwen3_5", "drafter_qwen3", "drafter_qwen3_5",
    }  # fmt: skip
    assert summary["total_seconds"] == pytest.approx(sum(summary["stage_seconds"].values()), 0.01)
    assert summary["jobs"] == 2 and summary["wall_seconds"] > 0
    for family, name in (("qwen3", "qwen3-tiny"), ("qwen3_5", "qwen35-tiny")):
        drafter = summary["drafters"][family]
        assert drafter["prompts"] == 8 and drafter["lossless"] is True
        assert drafter["tokens_per_cycle"] >= 1.0
        assert set(drafter["by_kind"]) == {"free_text", "code", "tool_call", "json"}
        # The drafter loads through the engine's loader, against its own target.
        target, _, config = load_target(root / name)
        load_draft(root / f"{name}-dflash", TargetInfo.from_config(config, family=target.family))


def test_same_recipe_and_seed_give_the_same_files(two_builds: tuple[Path, Path]) -> None:
    a, b = (_digests(root) for root in two_builds)
    assert len([k for k in a if k.endswith("model.safetensors")]) == 4  # 2 targets, 2 drafters
    assert a == b


def test_build_records_its_files_and_compare_finds_a_changed_one(
    two_builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_builds
    recorded = json.loads((a / "build.json").read_text())["files"]
    assert recorded == family_files(a) and len(recorded) == 16  # 4 dirs; targets carry 6 files
    assert zoo_command.run(_compare_args(a, b)) == 0
    changed = b / "qwen35-tiny-dflash" / "config.json"
    original = changed.read_bytes()
    try:
        changed.write_bytes(original + b" ")
        assert zoo_command.run(_compare_args(a, b)) == 1
    finally:
        changed.write_bytes(original)
    out = capsys.readouterr().out
    assert "differs  qwen35-tiny-dflash/config.json" in out and "15/16 files identical" in out
    assert compare_families({}, recorded)[0].status == "missing"


def _compare_args(built: Path, reference: Path) -> argparse.Namespace:
    return _parse("compare", str(built), "--reference", str(reference))


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    zoo_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_one_job_builds_in_process_what_a_worker_builds(
    two_builds: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not byte for byte: the worker runs OpenBLAS on one thread, this process on every core,
    # and OpenBLAS splits some products differently (the bytes follow the thread count).
    recipe = TEST_RECIPE.only(("qwen3",)).without_drafters()
    build = build_family(tmp_path, recipe, 3, jobs=1, progress=True)
    assert build.jobs == 1 and set(build.target_dirs) == {"qwen3"}
    bar = capsys.readouterr().err  # three shared stages and one family
    assert "zoo build: 1 families, 1 worker(s)" in bar and "4/4" in bar
    worker = json.loads((two_builds[0] / "build.json").read_text())["training"]["qwen3"]
    assert build.training["qwen3"].first_loss == pytest.approx(worker["first_loss"], abs=1e-4)
    assert build.training["qwen3"].final_loss == pytest.approx(worker["final_loss"], abs=1e-2)
    config = "qwen3-tiny/config.json"
    assert _digests(tmp_path)[config] == _digests(two_builds[0])[config]


def _args(**overrides: object) -> argparse.Namespace:
    args = _parse("build", "--out", "x")
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_cli_recipe_overrides() -> None:
    assert zoo_command.recipe_from_args(_args()) == CPU
    recipe = zoo_command.recipe_from_args(
        _args(
            recipe="h200",
            family=["qwen3_5"],
            steps_qwen35=7,
            draft_prompts=50,
            draft_steps=9,
            distill_batch=2,
        )
    )
    h200 = RECIPES["h200"]
    assert list(recipe.targets) == ["qwen3_5"] and list(recipe.drafters) == ["qwen3_5"]
    assert recipe.targets["qwen3_5"].steps == 7
    assert recipe.targets["qwen3_5"].lr == h200.targets["qwen3_5"].lr
    drafter = recipe.drafters["qwen3_5"]
    assert (drafter.pool, drafter.prompts, drafter.steps, drafter.distill_batch) == (50, 50, 9, 2)
    assert drafter.with_corpus == h200.drafters["qwen3_5"].with_corpus
    assert zoo_command.recipe_from_args(_args(targets_only=True)).drafters == {}


def test_embedded_family_is_the_cpu_recipes_build() -> None:
    """The embedded files are the ones their shipped build record lists, made by `cpu`."""
    from toolflash.engine.factory import assets_dir

    record = json.loads((assets_dir() / "build.json").read_text())
    # Every setting (the summary is prose, edited after the build).
    settings = json.loads(json.dumps(CPU.to_json()))
    assert {**record["recipe"], "summary": CPU.summary} == settings
    assert record["seed"] == 0 and record["jobs"] == 2
    assert family_files(assets_dir()) == record["files"]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_embedded_training_logs_match_the_cpu_recipe(family: str) -> None:
    from toolflash.engine.factory import assets_dir
    from toolflash.zoo.target_configs import DIR_NAMES

    target_dir = assets_dir() / DIR_NAMES[family]  # type: ignore[index]
    trained = json.loads((target_dir / "training.json").read_text())
    target = CPU.targets[family]  # type: ignore[index]
    assert (trained["steps"], trained["batch_size"], trained["seq_len"]) == (
        target.steps,
        target.batch_size,
        target.seq_len,
    )
    report = json.loads(
        (target_dir.parent / f"{target_dir.name}-dflash/training_report.json").read_text()
    )
    drafter = CPU.drafters[family]  # type: ignore[index]
    assert report["data"]["prompts"] == (drafter.prompts or drafter.pool)
    assert report["data"]["max_new_tokens"] == drafter.max_new_tokens
    assert report["train_config"]["steps"] == drafter.steps
    assert report["train_config"]["batch_size"] == drafter.batch_size
    assert report["train_config"]["lr"] == drafter.lr
    shape = report["drafter"]
    assert (shape["layers"], shape["block_size"]) == (drafter.layers, drafter.block_size)
    assert tuple(shape["target_layer_ids"]) == drafter.target_layer_ids
