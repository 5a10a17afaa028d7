"""The distillation prompt pool: balanced, distinct, seeded, and disjoint from evaluation."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from toolflash.commands import zoo as zoo_command
from toolflash.engine.factory import EMBEDDED_TARGET, assets_dir
from toolflash.training.data import load_prompt_records
from toolflash.zoo import prompt_pool
from toolflash.zoo import stdlib_source as stdlib
from toolflash.zoo.drafters import held_out_prompts
from toolflash.zoo.prompt_pool import distillation_pool, prompt_key
from toolflash.zoo.records import Record


@pytest.fixture(scope="module")
def shipped_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(assets_dir() / EMBEDDED_TARGET))


def test_pool_is_balanced_distinct_and_seeded() -> None:
    pool = distillation_pool(200, seed=0)
    assert Counter(p.kind for p in pool) == {
        "tool_call": 70,
        "free_text": 60,
        "code": 40,
        "json": 30,
    }
    keys = [prompt_key(p) for p in pool]
    assert len(set(keys)) == len(keys)
    assert [prompt_key(p) for p in distillation_pool(200, seed=0)] == keys
    assert len(set(keys) & {prompt_key(p) for p in distillation_pool(200, seed=1)}) < 20
    with pytest.raises(ValueError, match="count"):
        distillation_pool(0)


@pytest.mark.parametrize("seed", [0, 3])
def test_pool_is_disjoint_from_held_out_prompts(seed: int) -> None:
    pool = distillation_pool(1200, seed=seed)
    held = {prompt_key(p) for p in held_out_prompts(100, seed)}
    held |= {prompt_key(p) for p in held_out_prompts(100, 0)}
    assert not held & {prompt_key(p) for p in pool}
    # No code or doc question about any function of a held-out stdlib file, evaluated or not.
    asked = "\n".join(p.messages[-1]["content"] for p in pool if p.kind in ("code", "free_text"))
    for rel in stdlib.stdlib_files():
        if stdlib.is_held_out(rel):
            module = stdlib.module_name(rel)
            for fn in stdlib.functions(rel):
                assert fn.header not in asked
                assert f"`{module}.{fn.name}`" not in asked


def test_sources_run_dry_and_hand_their_quota_on(
    shipped_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under 120 tokens a dialogue (system prompt + tool schemas) never fits: tool calls get
    # nothing, the other kinds take their share. Lower patience keeps the test short.
    monkeypatch.setattr(prompt_pool, "PATIENCE", 200)
    pool = distillation_pool(100, seed=0, tokenizer=shipped_tokenizer, max_tokens=120)
    assert len(pool) == 100
    kinds = Counter(p.kind for p in pool)
    assert "tool_call" not in kinds and kinds["json"] > 15 and kinds["code"] > 20
    for p in pool:
        ids = shipped_tokenizer.encode(p.render(shipped_tokenizer), add_special_tokens=False)
        assert len(ids) <= 120


def test_corpus_records_are_a_source() -> None:
    turns = [{"role": "user", "content": "corpus question"}, {"role": "assistant", "content": "a"}]
    records = [Record(kind="code_chat", messages=turns)]
    pool = distillation_pool(40, seed=0, records=records)
    assert sum(p.messages == turns[:1] for p in pool) == 1


def test_zoo_prompts_command_writes_train_draft_data(
    tmp_path: Path, shipped_tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    zoo_command.add_arguments(parser)
    out = tmp_path / "pool.jsonl"
    args = parser.parse_args(["prompts", "--out", str(out), "--count", "24", "--seed", "2"])
    assert zoo_command.run(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["prompts"] == 24 and sum(summary["by_kind"].values()) == 24
    # What train-draft --data reads: one chat request per line, kinds kept.
    records = load_prompt_records(out, shipped_tokenizer)
    assert len(records) == 24
    assert Counter(r.kind for r in records) == summary["by_kind"]
    assert all(r.response is None and 0 < len(r.tokens) <= 1536 for r in records)
