"""Write tiny random-weight mlx-lm model directories (with a small byte-level BPE tokenizer and
a ChatML template) and matching z-lab drafters, for tests that load through the real paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.utils import save_config, save_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from toolflash.engine.draft_loading import save_draft
from toolflash.engine.drafter import DFlashDrafter, DraftConfig

from .tiny_models import qwen35_text_config

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<|mask|>",
]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. Hello world!",
    '{"name": "read_file", "arguments": {"path": "src/main.py"}}',
    "import os\nprint(os.getcwd())\n",
] * 20


def write_tokenizer(out: Path, vocab_size: int = 320) -> int:
    """A byte-level BPE tokenizer dir; returns its vocabulary size."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXT, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": TEMPLATE,
            }
        )
    )
    return int(tok.get_vocab_size())


def write_qwen3_target(
    out: Path, seed: int = 0, layers: int = 4, hidden: int = 64
) -> dict[str, Any]:
    """A random Qwen3 target directory loadable by mlx_lm.load."""
    from mlx_lm.models import qwen3

    vocab = write_tokenizer(out)
    config = {
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "eos_token_id": SPECIALS.index("<|im_end|>"),
    }
    mx.random.seed(seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    model.model.embed_tokens.weight = model.model.embed_tokens.weight * 4.0
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(config, out / "config.json")
    return config


def write_qwen35_target(
    out: Path, seed: int = 0, layers: int = 4, hidden: int = 64
) -> dict[str, Any]:
    """A random Qwen3.5 hybrid target directory (GatedDeltaNet + attention)."""
    from mlx_lm.models import qwen3_5

    vocab = write_tokenizer(out)
    text = qwen35_text_config(vocab, layers, hidden, max_positions=2048)
    config = {
        "model_type": "qwen3_5",
        "text_config": text,
        "eos_token_id": SPECIALS.index("<|im_end|>"),
        # flat copies for drafter construction
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
    }
    mx.random.seed(seed)
    model = qwen3_5.Model(qwen3_5.ModelArgs(model_type="qwen3_5", text_config=text))
    emb = model.language_model.model.embed_tokens
    emb.weight = emb.weight * 4.0
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(
        {
            k: v
            for k, v in config.items()
            if k not in ("hidden_size", "num_hidden_layers", "vocab_size")
        },
        out / "config.json",
    )
    return config


def write_draft(
    out: Path, target_config: dict[str, Any], seed: int = 1, block_size: int = 8
) -> Path:
    """A random z-lab format drafter for a target written by write_qwen3_target."""
    hidden = target_config["hidden_size"]
    n = target_config["num_hidden_layers"]
    cfg = DraftConfig.from_dict(
        {
            "hidden_size": hidden,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": hidden // 4,
            "intermediate_size": 2 * hidden,
            "vocab_size": target_config["vocab_size"],
            "block_size": block_size,
            "num_target_layers": n,
            "rope_theta": 10000.0,
            "dflash_config": {
                "mask_token_id": SPECIALS.index("<|mask|>"),
                "target_layer_ids": [1, n - 2],
            },
        }
    )
    mx.random.seed(seed)
    drafter = DFlashDrafter(cfg)
    mx.eval(drafter.parameters())
    return save_draft(drafter, out)
