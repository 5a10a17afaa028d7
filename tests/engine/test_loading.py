"""Draft loading in the z-lab format (sharded and not), each rejection, save round trip, and
model resolution through a fake Hugging Face cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from toolflash.engine.api import EngineError
from toolflash.engine.draft_loading import (
    DraftLoadError,
    TargetInfo,
    load_draft,
    save_draft,
)
from toolflash.engine.drafter import DFlashDrafter, DraftConfig
from toolflash.engine.hub import ModelNotFoundError, resolve_model_path

TARGET = TargetInfo(hidden_size=32, num_layers=6, vocab_size=128, family="qwen3")


def zlab_config(**overrides: Any) -> dict[str, Any]:
    """z-lab/Qwen3-4B-DFlash-b16's config.json, every key kept, dimensions scaled down
    (real: hidden 2560, 5 layers, 36 target layers, vocab 151936, mask 151669)."""
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 16,
        "bos_token_id": 120,
        "dflash_config": {"mask_token_id": 125, "target_layer_ids": [1, 2, 3]},
        "dtype": "bfloat16",
        "eos_token_id": 121,
        "head_dim": 8,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "layer_types": ["full_attention", "full_attention"],
        "max_position_embeddings": 40960,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "num_target_layers": 6,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "transformers_version": "4.57.3",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 128,
    }
    cfg.update(overrides)
    return cfg


def zlab_qwen35_config(**overrides: Any) -> dict[str, Any]:
    """z-lab/Qwen3.5-4B-DFlash's config.json shape (transformers 5: `rope_parameters`,
    `block_size` only inside `dflash_config`, 5 sliding + 1 full attention layers), scaled
    down (real: hidden 2560, 6 layers, 32 target layers, 8 feature layers, vocab 248320)."""
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "bos_token_id": None,
        "dflash_config": {"block_size": 16, "mask_token_id": 125, "target_layer_ids": [1, 4]},
        "dtype": "bfloat16",
        "eos_token_id": 121,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 262144,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "num_target_layers": 6,
        "pad_token_id": None,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
        "sliding_window": 4096,
        "tie_word_embeddings": True,
        "transformers_version": "5.7.0",
        "use_cache": True,
        "use_sliding_window": True,
        "vocab_size": 128,
    }
    cfg.update(overrides)
    return cfg


def random_weights(cfg: dict[str, Any], seed: int = 0) -> dict[str, mx.array]:
    """Random bf16 tensors under the z-lab names for `cfg`."""
    mx.random.seed(seed)
    drafter = DFlashDrafter(DraftConfig.from_dict(cfg))
    return {
        k: (mx.random.normal(v.shape) * 0.05).astype(mx.bfloat16)
        for k, v in dict(tree_flatten(drafter.parameters())).items()
    }


def write_draft(
    path: Path,
    cfg: dict[str, Any],
    weights: dict[str, mx.array],
    shards: int = 1,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    if shards == 1:
        mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "pt"})
        return path
    names = sorted(weights)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[s::shards]}
        mx.save_safetensors(str(path / file), part, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return path


def draft_output(drafter: DFlashDrafter, seed: int = 1) -> np.ndarray:
    cfg = drafter.config
    mx.random.seed(seed)
    feats = mx.random.normal((1, 5, len(cfg.target_layer_ids) * cfg.hidden_size))
    block = mx.random.normal((1, 4, cfg.hidden_size))
    ctx = drafter.context_kv(drafter.fuse(feats), 0)
    return np.array(drafter.denoise(block, 5, ctx))


def reference_drafter(cfg: dict[str, Any], weights: dict[str, mx.array]) -> DFlashDrafter:
    ref = DFlashDrafter(DraftConfig.from_dict(cfg))
    ref.load_weights([(k, v.astype(mx.float32)) for k, v in weights.items()])
    return ref


@pytest.mark.parametrize("shards", [1, 3])
def test_loads_zlab_layout(tmp_path: Path, shards: int) -> None:
    cfg = zlab_config()
    weights = random_weights(cfg)
    drafter = load_draft(write_draft(tmp_path / "d", cfg, weights, shards), TARGET)
    assert drafter.config.block_size == 16
    assert drafter.config.target_layer_ids == (1, 2, 3)
    assert drafter.config.mask_token_id == 125
    params = dict(tree_flatten(drafter.parameters()))
    assert set(params) == set(weights)
    assert all(v.dtype == mx.float32 for v in params.values())  # CPU default
    np.testing.assert_array_equal(
        np.array(params["fc.weight"]), np.array(weights["fc.weight"].astype(mx.float32))
    )
    np.testing.assert_allclose(
        draft_output(drafter), draft_output(reference_drafter(cfg, weights)), rtol=1e-5
    )


def test_requested_dtype(tmp_path: Path) -> None:
    cfg = zlab_config()
    path = write_draft(tmp_path / "d", cfg, random_weights(cfg))
    drafter = load_draft(path, TARGET, dtype=mx.bfloat16)
    params = dict(tree_flatten(drafter.parameters()))
    assert {v.dtype for v in params.values()} == {mx.bfloat16}


def test_block_size_inside_dflash_config(tmp_path: Path) -> None:
    cfg = zlab_config()
    del cfg["block_size"]
    cfg["dflash_config"] = {**cfg["dflash_config"], "block_size": 8}
    drafter = load_draft(write_draft(tmp_path / "d", cfg, random_weights(cfg)), TARGET)
    assert drafter.config.block_size == 8


def test_strips_model_prefix(tmp_path: Path) -> None:
    cfg = zlab_config()
    weights = random_weights(cfg)
    prefixed = {f"model.{k}": v for k, v in weights.items()}
    drafter = load_draft(write_draft(tmp_path / "d", cfg, prefixed, shards=2), TARGET)
    np.testing.assert_allclose(
        draft_output(drafter), draft_output(reference_drafter(cfg, weights)), rtol=1e-5
    )


def test_save_round_trip_uses_zlab_names(tmp_path: Path) -> None:
    cfg = zlab_config(num_hidden_layers=1, layer_types=["full_attention"])
    src = load_draft(write_draft(tmp_path / "src", cfg, random_weights(cfg)), TARGET)
    out = save_draft(src, tmp_path / "out")
    stored = mx.load(str(out / "model.safetensors"))
    assert isinstance(stored, dict)
    layer = [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {f"layers.0.{n}" for n in layer}
    assert set(stored) == expected
    assert stored["fc.weight"].shape == (32, 3 * 32)
    saved_cfg = json.loads((out / "config.json").read_text())
    assert saved_cfg["block_size"] == 16
    assert saved_cfg["num_target_layers"] == 6
    assert saved_cfg["dflash_config"] == {"mask_token_id": 125, "target_layer_ids": [1, 2, 3]}
    assert saved_cfg["architectures"] == ["DFlashDraftModel"]
    again = load_draft(out, TARGET)
    np.testing.assert_array_equal(draft_output(again), draft_output(src))


def _rejects(tmp_path: Path, cfg: dict[str, Any], weights: dict[str, mx.array], match: str):
    path = write_draft(tmp_path / "bad", cfg, weights)
    with pytest.raises(DraftLoadError, match=match) as info:
        load_draft(path, TARGET)
    assert isinstance(info.value, EngineError)
    return info.value


def test_rejects_hidden_size_mismatch(tmp_path: Path) -> None:
    cfg = zlab_config(hidden_size=48)
    _rejects(tmp_path, cfg, random_weights(cfg), r"hidden_size 48 does not match")


def test_rejects_mask_outside_target_embedding(tmp_path: Path) -> None:
    cfg = zlab_config(dflash_config={"mask_token_id": 128, "target_layer_ids": [1, 2, 3]})
    _rejects(tmp_path, cfg, random_weights(cfg), r"mask_token_id 128 is outside .*128 rows")


@pytest.mark.parametrize("extra", ["lm_head.weight", "embed_tokens.weight", "model.lm_head.weight"])
def test_rejects_own_lm_head_or_embedding(tmp_path: Path, extra: str) -> None:
    cfg = zlab_config()
    weights = random_weights(cfg)
    weights[extra] = mx.zeros((128, 32), dtype=mx.bfloat16)
    _rejects(tmp_path, cfg, weights, r"carries its own .*(lm_head|embed_tokens)")


@pytest.mark.parametrize("ids", [[1, 2, 6], [-1, 2, 3]])
def test_rejects_layer_ids_out_of_range(tmp_path: Path, ids: list[int]) -> None:
    cfg = zlab_config(dflash_config={"mask_token_id": 125, "target_layer_ids": ids})
    _rejects(tmp_path, cfg, random_weights(cfg), r"target_layer_ids .* out of range")


def test_rejects_other_target_depth(tmp_path: Path) -> None:
    cfg = zlab_config(num_target_layers=36)
    _rejects(tmp_path, cfg, random_weights(cfg), r"num_target_layers 36 does not match")


def test_sliding_attention_layers_load_with_their_window(tmp_path: Path) -> None:
    cfg = zlab_config(
        layer_types=["full_attention", "sliding_attention"],
        sliding_window=64,
        use_sliding_window=True,
    )
    drafter = load_draft(write_draft(tmp_path / "d", cfg, random_weights(cfg)), TARGET)
    assert [layer.sliding_window for layer in drafter.layers] == [None, 64]


def test_zlab_qwen35_sliding_draft_loads(tmp_path: Path) -> None:
    cfg = zlab_qwen35_config()
    drafter = load_draft(write_draft(tmp_path / "d", cfg, random_weights(cfg)), TARGET)
    assert drafter.config.block_size == 16
    assert drafter.config.rope_theta == 10_000_000
    assert dict(tree_flatten(drafter.parameters()))["fc.weight"].shape == (32, 64)
    assert drafter.layers[0].sliding_window == 4096 and drafter.has_sliding_layers


def test_sliding_window_derived_like_transformers(tmp_path: Path) -> None:
    cfg = zlab_config(use_sliding_window=True, sliding_window=64, max_window_layers=1)
    del cfg["layer_types"]
    drafter = load_draft(write_draft(tmp_path / "d", cfg, random_weights(cfg)), TARGET)
    assert [layer.sliding_window for layer in drafter.layers] == [None, 64]


def test_sliding_window_flag_below_max_window_layers_loads(tmp_path: Path) -> None:
    # Like z-lab's Qwen3.5 drafts: use_sliding_window set, but no layer reaches max_window_layers.
    cfg = zlab_config(use_sliding_window=True, sliding_window=4096)
    del cfg["layer_types"], cfg["max_window_layers"]
    load_draft(write_draft(tmp_path / "d", cfg, random_weights(cfg)), TARGET)


def test_rejects_missing_tensor(tmp_path: Path) -> None:
    cfg = zlab_config()
    weights = random_weights(cfg)
    del weights["layers.1.mlp.down_proj.weight"]
    _rejects(tmp_path, cfg, weights, r"miss 1 tensors: layers\.1\.mlp\.down_proj\.weight")


def test_rejects_unexpected_tensor(tmp_path: Path) -> None:
    cfg = zlab_config()
    weights = random_weights(cfg)
    weights["markov_head.weight"] = mx.zeros((4, 4))
    _rejects(tmp_path, cfg, weights, r"unexpected tensors: markov_head\.weight")


def test_rejects_wrong_shape_naming_tensor(tmp_path: Path) -> None:
    cfg = zlab_config()
    weights = random_weights(cfg)
    weights["layers.0.self_attn.k_proj.weight"] = mx.zeros((8, 32), dtype=mx.bfloat16)
    _rejects(tmp_path, cfg, weights, r"layers\.0\.self_attn\.k_proj\.weight has shape \[8, 32\]")


def test_rejects_missing_config_key(tmp_path: Path) -> None:
    cfg = zlab_config()
    del cfg["num_target_layers"], cfg["dflash_config"]["target_layer_ids"]
    _rejects(
        tmp_path,
        cfg,
        random_weights(zlab_config()),
        r"neither .*target_layer_ids nor num_target_layers",
    )


def test_num_target_layers_may_be_absent_with_explicit_layer_ids(tmp_path: Path) -> None:
    # Seen in some published Qwen3.5 draft configs: explicit ids, no top-level depth.
    cfg = zlab_config()
    del cfg["num_target_layers"]
    drafter = load_draft(write_draft(tmp_path / "d", cfg, random_weights(cfg)), TARGET)
    assert drafter.config.num_target_layers is None


def test_rejects_missing_shard_and_missing_weights(tmp_path: Path) -> None:
    cfg = zlab_config()
    path = write_draft(tmp_path / "d", cfg, random_weights(cfg), shards=2)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DraftLoadError, match=r"shard model-00002-of-00002.safetensors .* missing"):
        load_draft(path, TARGET)
    (path / "model.safetensors.index.json").unlink()
    with pytest.raises(DraftLoadError, match=r"neither model.safetensors nor"):
        load_draft(path, TARGET)


def test_target_info_from_hybrid_config() -> None:
    cfg = {
        "model_type": "qwen3_5",
        "text_config": {"hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 300},
    }
    info = TargetInfo.from_config(cfg)
    assert info == TargetInfo(hidden_size=64, num_layers=8, vocab_size=300, family="qwen3_5")


# --- model resolution -------------------------------------------------------------------


def fake_hub_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<sha>/}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    return snap


def test_local_directory_used_as_is(tmp_path: Path) -> None:
    assert resolve_model_path(str(tmp_path)) == tmp_path


def test_resolves_cached_hub_id_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = fake_hub_cache(
        tmp_path, "z-lab/Tiny-DFlash", {"config.json": b"{}", "model.safetensors": b"x"}
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_path("z-lab/Tiny-DFlash") == snap


def test_cached_hub_id_needs_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = fake_hub_cache(
        tmp_path, "z-lab/Tiny-DFlash", {"config.json": b"{}", "model-1.safetensors": b"x"}
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
    assert resolve_model_path("z-lab/Tiny-DFlash") == snap


def test_missing_hub_id_offline_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path("nobody/not-a-model")
    msg = str(info.value)
    assert "neither a local directory nor cached" in msg
    assert "HF_HUB_OFFLINE" in msg and "hf download nobody/not-a-model" in msg
    assert isinstance(info.value, EngineError)


def test_incomplete_cache_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub_cache(tmp_path, "org/partial", {"config.json": b"{}"})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="incompletely"):
        resolve_model_path("org/partial")


def test_unreachable_hub_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    # Port 9 (discard) on localhost: connection refused at once, no real network involved.
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ModelNotFoundError, match="could not be reached"):
        resolve_model_path("nobody/not-a-model")


@pytest.mark.parametrize("arg", ["./no/such/dir", "/no/such/dir", "a/b/c"])
def test_nonexistent_paths(arg: str) -> None:
    with pytest.raises(ModelNotFoundError, match="not a local directory"):
        resolve_model_path(arg)


def test_prefill_chunk_follows_the_device() -> None:
    import mlx.core as mx

    from toolflash.engine.factory import GPU_PREFILL_CHUNK, prefill_chunk_for
    from toolflash.engine.session import PREFILL_CHUNK

    assert prefill_chunk_for(mx.cpu) == PREFILL_CHUNK < GPU_PREFILL_CHUNK
    assert prefill_chunk_for(mx.gpu) == GPU_PREFILL_CHUNK
