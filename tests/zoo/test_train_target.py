"""A tiny training run per family: loss falls, mlx_lm.load reads the result, it generates."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from toolflash.zoo.records import Record
from toolflash.zoo.train_target import pack_windows, train_target


def test_pack_windows_shifts_by_one() -> None:
    import numpy as np

    windows = pack_windows(np.arange(21, dtype=np.int32), 5)
    assert windows.shape == (4, 6)
    assert windows[1].tolist() == [5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_short_run_learns_and_loads(
    family: str, small_corpus: list[Record], tokenizer_dir: Path, tmp_path: Path
) -> None:
    import mlx_lm

    out = tmp_path / family
    result = train_target(
        family,  # type: ignore[arg-type]
        small_corpus,
        tokenizer_dir,
        out,
        steps=20,
        seed=0,
        batch_size=4,
        seq_len=128,
        lr=3e-3,
    )
    assert result.final_loss < result.first_loss - 1.0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()

    model, tokenizer = mlx_lm.load(str(out))
    weights = dict(mx.load(str(out / "model.safetensors")).items())
    assert {v.dtype for k, v in weights.items() if not k.endswith("A_log")} == {mx.bfloat16}
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    text = mlx_lm.generate(model, tokenizer, prompt, max_tokens=8)
    assert isinstance(text, str) and len(tokenizer.encode(text)) >= 1
