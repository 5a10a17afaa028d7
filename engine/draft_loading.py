"""Load and save DFlash drafters in the z-lab format, validated against the target they serve.

A z-lab draft directory holds `config.json` (a Qwen3 config plus `block_size`,
`num_target_layers`, `dflash_config.{target_layer_ids,mask_token_id}`) and `model.safetensors`
or `model.safetensors.index.json` + shards, with tensor names relative to the drafter (`fc`,
`hidden_norm`, `norm`, `layers.{i}.*`) and no embedding or lm_head: the drafter borrows the
target's. Everything is checked before any weight is loaded into the module, so a wrong
pairing fails with a message naming the cause rather than a shape error deep in MLX.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import structlog
from mlx.utils import tree_flatten

from toolflash.engine.api import EngineError
from toolflash.engine.drafter import DFlashDrafter, DraftConfig, DraftConfigError

log = structlog.get_logger(__name__)

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_BORROWED_PREFIXES = ("lm_head.", "embed_tokens.")


class DraftLoadError(EngineError):
    """A draft directory that is not a usable DFlash drafter for the given target."""


@dataclass(frozen=True)
class TargetInfo:
    """What the drafter must agree with in its target."""

    hidden_size: int
    num_layers: int
    vocab_size: int  # rows of the target's input embedding
    family: str

    @classmethod
    def from_config(cls, config: Mapping[str, Any], family: str | None = None) -> TargetInfo:
        """From an mlx-lm/HF target config.json (Qwen3.5 nests the text model in
        `text_config`)."""
        text = config.get("text_config") or config
        try:
            return cls(
                hidden_size=int(text["hidden_size"]),
                num_layers=int(text["num_hidden_layers"]),
                vocab_size=int(text["vocab_size"]),
                family=family or str(text.get("model_type") or config.get("model_type", "")),
            )
        except KeyError as exc:
            raise DraftLoadError(f"target config.json lacks {exc.args[0]}") from exc


def read_draft_config(path: Path) -> DraftConfig:
    """Parse `path/config.json` as a DFlash draft config."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise DraftLoadError(f"draft directory {path} has no config.json")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise DraftLoadError(f"{cfg_file} is not valid JSON: {exc}") from exc
    try:
        return DraftConfig.from_dict(raw)
    except DraftConfigError as exc:
        raise DraftLoadError(f"{cfg_file}: {exc}") from exc


def check_config(cfg: DraftConfig, target: TargetInfo) -> None:
    """Reject a draft config that does not fit `target` (raises DraftLoadError)."""
    where = f"target ({target.family}, hidden {target.hidden_size}, {target.num_layers} layers)"
    if cfg.hidden_size != target.hidden_size:
        raise DraftLoadError(
            f"draft hidden_size {cfg.hidden_size} does not match the {where}: this draft was "
            "trained for another model"
        )
    # A draft trained against a target of another depth reads features from layers that mean
    # something else in this one: it would run, but accept almost nothing, and a silent 0%
    # acceptance looks like a slow engine. Refuse it instead of warning.
    if cfg.num_target_layers is not None and cfg.num_target_layers != target.num_layers:
        raise DraftLoadError(
            f"draft num_target_layers {cfg.num_target_layers} does not match the {where}: "
            "this draft was trained for another model"
        )
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise DraftLoadError(
            f"draft dflash_config.target_layer_ids {list(cfg.target_layer_ids)} has ids "
            f"{bad} out of range for the {where} (valid: 0..{target.num_layers - 1})"
        )
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise DraftLoadError(
            f"draft dflash_config.mask_token_id {cfg.mask_token_id} is outside the target's "
            f"embedding ({target.vocab_size} rows)"
        )
    if cfg.block_size < 2:
        raise DraftLoadError(f"draft block_size {cfg.block_size} must be at least 2")
    if cfg.vocab_size != target.vocab_size:
        # Informational only: the draft has no embedding, it uses the target's.
        log.warning(
            "draft_vocab_mismatch", draft_vocab=cfg.vocab_size, target_vocab=target.vocab_size
        )


def read_weights(path: Path) -> dict[str, mx.array]:
    """All tensors of a draft directory, sharded or not, names as stored."""
    index_file = path / INDEX_FILE
    if index_file.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index_file.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise DraftLoadError(f"{index_file} has no readable weight_map: {exc}") from exc
        weights: dict[str, mx.array] = {}
        for shard in sorted(set(weight_map.values())):
            shard_file = path / shard
            if not shard_file.is_file():
                raise DraftLoadError(f"shard {shard} listed in {INDEX_FILE} is missing")
            weights.update(_load_file(shard_file))
        absent = sorted(set(weight_map) - set(weights))
        if absent:
            raise DraftLoadError(
                f"tensors listed in {INDEX_FILE} are absent from their shards: {_few(absent)}"
            )
        return weights
    single = path / WEIGHTS_FILE
    if single.is_file():
        return _load_file(single)
    raise DraftLoadError(f"draft directory {path} has neither {WEIGHTS_FILE} nor {INDEX_FILE}")


def _load_file(file: Path) -> dict[str, mx.array]:
    try:
        loaded = mx.load(str(file))
    except Exception as exc:  # MLX raises RuntimeError/ValueError for corrupt files
        raise DraftLoadError(f"cannot read {file}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise DraftLoadError(f"{file} is not a safetensors file of named tensors")
    return loaded


def normalize_names(weights: Mapping[str, mx.array]) -> dict[str, mx.array]:
    """Strip a leading `model.` some exports add (z-lab names have none)."""
    out: dict[str, mx.array] = {}
    for name, value in weights.items():
        key = name[len("model.") :] if name.startswith("model.") else name
        if key in out:
            raise DraftLoadError(f"tensor {key} appears both with and without a 'model.' prefix")
        out[key] = value
    return out


def check_weights(drafter: DFlashDrafter, weights: Mapping[str, mx.array]) -> None:
    """Names and shapes of `weights` must be exactly the drafter's parameters."""
    borrowed = sorted(k for k in weights if k.startswith(_BORROWED_PREFIXES))
    if borrowed:
        raise DraftLoadError(
            f"draft carries its own {_few(borrowed)}: DFlash drafts use the target's embedding "
            "and lm_head (this looks like a DFlash2/EAGLE-style export, not a z-lab DFlash draft)"
        )
    if any(k.endswith((".scales", ".biases")) for k in weights):
        raise DraftLoadError("quantized draft checkpoints are not supported; use the bf16 draft")
    expected = dict(tree_flatten(drafter.parameters()))
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise DraftLoadError(f"draft weights miss {len(missing)} tensors: {_few(missing)}")
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise DraftLoadError(
            f"draft weights have {len(unexpected)} unexpected tensors: {_few(unexpected)}"
        )
    for name, param in expected.items():
        got = tuple(weights[name].shape)
        if got != tuple(param.shape):
            raise DraftLoadError(
                f"draft tensor {name} has shape {list(got)}, expected {list(param.shape)} "
                "from config.json"
            )


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... (+{len(names) - limit} more)" if len(names) > limit else "")


def default_dtype() -> mx.Dtype | None:
    """float32 on CPU (bf16 matmuls are slow there); None keeps the stored dtype elsewhere."""
    return mx.float32 if mx.default_device() == mx.cpu else None


def load_draft(path: Path, target: TargetInfo, dtype: mx.Dtype | None = None) -> DFlashDrafter:
    """Load a z-lab-format DFlash drafter from `path`, checked against `target`.

    `dtype` casts floating weights (default: float32 on CPU, stored dtype otherwise).
    Raises DraftLoadError naming the first problem found."""
    path = Path(path)
    cfg = read_draft_config(path)
    check_config(cfg, target)
    weights = normalize_names(read_weights(path))
    drafter = DFlashDrafter(cfg)  # parameters stay lazy: load_weights replaces them unevaluated
    check_weights(drafter, weights)
    dtype = dtype if dtype is not None else default_dtype()
    if dtype is not None:
        weights = {
            k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()
        }
    drafter.load_weights(list(weights.items()), strict=True)
    mx.eval(drafter.parameters())
    drafter.eval()
    log.info(
        "draft_loaded",
        path=str(path),
        layers=cfg.num_hidden_layers,
        block_size=cfg.block_size,
        target_layer_ids=list(cfg.target_layer_ids),
        tensors=len(weights),
    )
    return drafter


def save_draft(drafter: DFlashDrafter, out_dir: Path, dtype: mx.Dtype | None = None) -> Path:
    """Write `config.json` + `model.safetensors` with exactly the z-lab tensor names, optionally
    cast to `dtype` (z-lab ships bfloat16). Returns `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(drafter.parameters()))
    if dtype is not None:
        weights = {
            k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()
        }
    mx.save_safetensors(str(out_dir / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
    return out_dir
