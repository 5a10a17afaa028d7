"""Drafter config defaults: sizes from the target, valid feature layers, the mask token."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from toolflash.engine.draft_loading import TargetInfo, check_config
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target
from toolflash.training.draft_config import (
    DraftSetupError,
    default_block_size,
    default_draft_layers,
    default_target_layer_ids,
    draft_config_for,
    init_drafter,
    init_from_target,
    resolve_mask_token_id,
)

from ..engine.tiny_models import qwen3_target, qwen35_target
from .helpers import char_tokenizer


@pytest.mark.parametrize(
    ("layers", "expected"),
    [(4, [1, 2]), (6, [1, 4]), (8, [1, 3, 5]), (36, [1, 9, 17, 25, 33]), (64, [1, 16, 31, 46, 61])],
)
def test_default_target_layer_ids(layers: int, expected: list[int]) -> None:
    assert default_target_layer_ids(layers) == expected


@pytest.mark.parametrize("layers", range(1, 65))
def test_default_target_layer_ids_always_valid_and_distinct(layers: int) -> None:
    ids = default_target_layer_ids(layers)
    assert ids and all(0 <= i < layers for i in ids)
    assert len(set(ids)) == len(ids) == len(sorted(ids))


def test_default_sizes() -> None:
    assert default_draft_layers(4) == 1 and default_draft_layers(8) == 2
    assert default_draft_layers(36) == 5
    assert default_block_size(128) == 8 and default_block_size(4096) == 16


@pytest.mark.parametrize(
    ("make", "adapter"), [(qwen3_target, Qwen3Target), (qwen35_target, Qwen35Target)]
)
def test_config_copies_target_sizes_and_passes_engine_checks(make: Any, adapter: Any) -> None:
    target = adapter(make())
    cfg = draft_config_for(target, mask_token_id=200)
    assert cfg.hidden_size == target.hidden_size == 64
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.intermediate_size == 128
    assert cfg.target_layer_ids == (1, 2) and cfg.num_target_layers == 4
    assert cfg.block_size == 8 and cfg.num_hidden_layers == 1
    assert cfg.mask_token_id == 200
    info = TargetInfo(target.hidden_size, target.num_layers, target.vocab_size, target.family)
    check_config(cfg, info)
    drafter = init_drafter(cfg, seed=0)
    assert drafter.fc.weight.shape == (64, 128)


def test_config_rejects_bad_layers_and_mask() -> None:
    target = Qwen3Target(qwen3_target())
    with pytest.raises(DraftSetupError, match="out of range"):
        draft_config_for(target, 1, target_layer_ids=[1, 4])
    with pytest.raises(DraftSetupError, match="outside the target embedding"):
        draft_config_for(target, 256)


def test_mask_token_from_tokenizer() -> None:
    tok = char_tokenizer(with_mask=True)
    assert resolve_mask_token_id(tok, 256) == tok.convert_tokens_to_ids("<|mask|>")


def test_mask_token_falls_back_to_first_unused_row() -> None:
    tok = char_tokenizer(with_mask=False)
    assert resolve_mask_token_id(tok, 256) == len(tok.get_vocab())


def test_mask_token_error_when_embedding_is_full() -> None:
    tok = char_tokenizer(with_mask=False)
    with pytest.raises(DraftSetupError, match="no mask token"):
        resolve_mask_token_id(tok, len(tok.get_vocab()))


def test_init_from_target_copies_the_last_layers() -> None:
    target = Qwen3Target(qwen3_target())
    drafter = init_drafter(draft_config_for(target, 200, layers=2), seed=0)
    copied = init_from_target(drafter, target)
    assert "norm.weight" in copied and "fc.weight" not in copied
    assert len(copied) == 2 * 11 + 1  # every tensor of a Qwen3 decoder layer, twice
    src = target.inner.layers[3].mlp.down_proj.weight
    assert mx.array_equal(drafter.layers[1].mlp.down_proj.weight, src).item()


def test_init_from_target_skips_mismatched_hybrid_tensors() -> None:
    target = Qwen35Target(qwen35_target())
    drafter = init_drafter(draft_config_for(target, 200, layers=1), seed=0)
    copied = init_from_target(drafter, target)
    # The last hybrid layer is gated attention: its q_proj is twice as wide and stays fresh.
    assert "layers.0.self_attn.q_proj.weight" not in copied
    assert "layers.0.mlp.up_proj.weight" in copied
