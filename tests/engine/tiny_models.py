"""Tiny random-weight targets and drafters built in memory for engine tests."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models import qwen3, qwen3_5

from toolflash.engine.drafter import DFlashDrafter, DraftConfig

VOCAB = 256


def qwen3_target(seed: int = 0, layers: int = 4, hidden: int = 64) -> Any:
    mx.random.seed(seed)
    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    model = qwen3.Model(args)
    _sharpen(model)
    return model


def qwen35_text_config(
    vocab: int = VOCAB, layers: int = 4, hidden: int = 64, max_positions: int = 4096
) -> dict[str, Any]:
    """A tiny Qwen3.5 hybrid `text_config` (GatedDeltaNet and attention layers alternate)."""
    return {
        "model_type": "qwen3_5_text",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    }


def qwen35_target(seed: int = 0, layers: int = 4, hidden: int = 64) -> Any:
    mx.random.seed(seed)
    text = qwen35_text_config(VOCAB, layers, hidden)
    model = qwen3_5.Model(qwen3_5.ModelArgs(model_type="qwen3_5", text_config=text))
    _sharpen(model)
    return model


def _sharpen(model: Any) -> None:
    """Random tiny models have flat logits; scale the embedding so greedy choices are decided
    by clear margins (near-ties would make lossless comparisons depend on float rounding)."""
    emb = model.model.embed_tokens
    emb.weight = emb.weight * 4.0
    mx.eval(model.parameters())


def drafter_for(target: Any, seed: int = 1, block_size: int = 8, layers: int = 1) -> DFlashDrafter:
    mx.random.seed(seed)
    n_target = len(target.layers)
    hidden = target.model.embed_tokens.weight.shape[1]
    cfg = DraftConfig.from_dict(
        {
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": hidden // 4,
            "intermediate_size": 2 * hidden,
            "vocab_size": VOCAB,
            "block_size": block_size,
            "num_target_layers": n_target,
            "rope_theta": 10000.0,
            "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": [1, n_target - 2]},
        }
    )
    drafter = DFlashDrafter(cfg)
    mx.eval(drafter.parameters())
    return drafter
