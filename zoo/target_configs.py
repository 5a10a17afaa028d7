"""Configurations of the zoo's tiny targets, in the exact `config.json` shape mlx-lm loads."""

from __future__ import annotations

import copy
from typing import Any, Literal

import mlx.nn as nn

Family = Literal["qwen3", "qwen3_5"]
FAMILIES: tuple[Family, ...] = ("qwen3", "qwen3_5")
DIR_NAMES: dict[Family, str] = {"qwen3": "qwen3-tiny", "qwen3_5": "qwen35-tiny"}
MAX_POSITIONS = 32768


def target_config(
    family: Family,
    vocab_size: int,
    eos_token_id: int,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `config.json` of a tiny target of `family`.

    `overrides` replace architecture keys (in `text_config` for qwen3_5), e.g. smaller test models.
    """
    if family == "qwen3":
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "intermediate_size": 768,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "rms_norm_eps": 1e-6,
            "vocab_size": vocab_size,
            "max_position_embeddings": MAX_POSITIONS,
            "rope_theta": 1_000_000.0,
            "tie_word_embeddings": True,
            "eos_token_id": eos_token_id,
            "torch_dtype": "bfloat16",
            **(overrides or {}),
        }
    text_config = {
        "model_type": "qwen3_5_text",
        "hidden_size": 192,
        "num_hidden_layers": 4,
        "intermediate_size": 576,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": MAX_POSITIONS,
        # GatedDeltaNet ("linear attention") layers; key head dim a multiple of 32.
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        # Layers 0 and 2 are GatedDeltaNet, layers 1 and 3 full attention.
        "full_attention_interval": 2,
        "layer_types": ["linear_attention", "full_attention"] * 2,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "partial_rotary_factor": 0.25,
        },
        "tie_word_embeddings": True,
        "eos_token_id": eos_token_id,
        **(overrides or {}),
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_config,
        "tie_word_embeddings": True,
        "eos_token_id": eos_token_id,
        "torch_dtype": "bfloat16",
    }


def build_model(config: dict[str, Any]) -> nn.Module:
    """Instantiate mlx-lm's own model class for `config` (random init from MLX's global seed)."""
    from mlx_lm.models import qwen3, qwen3_5

    module = {"qwen3": qwen3, "qwen3_5": qwen3_5}[config["model_type"]]
    # mlx-lm's args rewrite nested dicts in place (rope_type -> type): keep `config` as saved.
    model: nn.Module = module.Model(module.ModelArgs.from_dict(copy.deepcopy(config)))
    return model
