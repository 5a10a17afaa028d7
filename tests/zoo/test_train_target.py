"""A tiny training run per family: loss falls, mlx_lm.load reads the result, it generates."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from toolflash.zoo.records import Record
from toolflash.zoo.train_target import pack_windows, train_target

# Same families at test size: fast even on a reference BLAS.
SMALL = {
    "qwen3": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "head_dim": 32,
              "num_attention_heads": 2, "num_key_value_heads": 1},
    "qwen3_5": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "head_dim": 32,
                "num_attention_heads": 2, "num_key_value_heads": 1, "linear_value_head_dim": 32,
                "layer_types": ["linear_attention", "full_attention"]},
}  # fmt: skip


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
        seq_len=64,
        lr=3e-3,
        config_overrides=SMALL[family],
    )
    assert result.final_loss < result.first_loss - 1.0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family
    arch = config.get("text_config", config)
    assert arch["hidden_size"] == 64 and arch["vocab_size"] == 4096
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()

    model, tokenizer = mlx_lm.load(str(out))
    weights = dict(mx.load(str(out / "model.safetensors")).items())
    assert {v.dtype for k, v in weights.items() if not k.endswith("A_log")} == {mx.bfloat16}
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    text = mlx_lm.generate(model, tokenizer, prompt, max_tokens=8)
    assert isinstance(text, str) and len(tokenizer.encode(text)) >= 1
