"""Build a ready `DFlashEngine` from model ids or paths (default: the embedded tiny pair)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import structlog

from toolflash.cache.prefix_cache import CacheConfig, PrefixCache

from .api import DEFAULT_DRAFT_LENGTH, DraftLength, EngineError
from .draft_context import DraftWindow
from .draft_loading import TargetInfo, load_draft
from .generation_config import read_generation_defaults
from .hub import resolve_model_path
from .registry import EMBEDDED_MODEL, EMBEDDED_PAIRS, draft_for
from .service import DFlashEngine, EngineOptions
from .session import PREFILL_CHUNK
from .targets.base import TargetAdapter
from .targets.qwen3 import Qwen3Target
from .targets.qwen3_5 import Qwen35Target

# Prompt tokens per prefill forward on a GPU, where larger forwards keep the device busy
# between host syncs (benchmarks/prefill_chunks.py); CPUs keep the session's own default.
GPU_PREFILL_CHUNK = 2048


def prefill_chunk_for(device: mx.Device) -> int:
    return PREFILL_CHUNK if device == mx.cpu else GPU_PREFILL_CHUNK


log = structlog.get_logger(__name__)

# mlx-lm model_type -> adapter. Unknown families fail with a clear message.
TARGET_ADAPTERS: dict[str, type] = {
    "qwen3": Qwen3Target,
    "qwen3_5": Qwen35Target,
    "qwen3_5_moe": Qwen35Target,
}

EMBEDDED_TARGET, EMBEDDED_DRAFT = EMBEDDED_PAIRS[EMBEDDED_MODEL]


class UnsupportedModelError(EngineError):
    """A target whose family has no adapter."""


def assets_dir() -> Path:
    """Where the embedded tiny models live (inside the installed package)."""
    import toolflash

    return Path(toolflash.__file__).resolve().parent / "assets" / "tiny"


def read_model_type(path: Path) -> str:
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config") or {}
    return str(config.get("model_type") or text.get("model_type") or "")


def load_target(
    path: Path, dtype: mx.Dtype | None = None, lazy: bool = False
) -> tuple[TargetAdapter, Any, dict]:
    """Load an mlx-lm target directory and wrap it in its family's adapter (`lazy`: no weight
    is read yet; a pipeline rank reads only its own layers')."""
    from mlx_lm.utils import load

    model_type = read_model_type(path)
    adapter_cls = TARGET_ADAPTERS.get(model_type)
    if adapter_cls is None:
        raise UnsupportedModelError(
            f"model family '{model_type}' ({path}) is not supported; supported: "
            f"{', '.join(sorted(TARGET_ADAPTERS))}"
        )
    loaded = load(str(path), lazy=lazy)
    model, tokenizer = loaded[0], loaded[1]
    if dtype is None and mx.default_device() == mx.cpu:
        dtype = mx.float32  # only float32 reaches BLAS on CPU
    if dtype is not None:
        model.set_dtype(dtype)
    if not lazy:
        mx.eval(model.parameters())
    config = json.loads((path / "config.json").read_text())
    return adapter_cls(model), tokenizer, config


def locate_target(model: str | None) -> Path:
    """The target directory of `model` (None: the default embedded pair)."""
    if model is None or model in EMBEDDED_PAIRS:
        path = assets_dir() / EMBEDDED_PAIRS[model or EMBEDDED_MODEL][0]
        if not (path / "config.json").exists():
            raise EngineError(
                f"the embedded tiny model is missing at {path}; rebuild it with "
                "`toolflash zoo build` or pass --model"
            )
        return path
    return resolve_model_path(model)


def build_engine(
    model: str | None = None,
    draft: str | None = None,
    *,
    mode: str = "spec",
    block_size: int | None = None,
    draft_length: DraftLength = DEFAULT_DRAFT_LENGTH,
    window: DraftWindow | None = None,
    context_length: int | None = None,
    no_draft: bool = False,
    cache: CacheConfig | None = None,
    pipeline: Any = None,
) -> DFlashEngine:
    """Load target and drafter and return the engine. model=None serves the default embedded
    tiny pair, an id of `EMBEDDED_PAIRS` that pair; draft=None looks any other target up in
    the registry of published DFlash drafts. `pipeline` (an mx.distributed group, this process
    its rank 0) splits the target's layers across the group's ranks (engine/distributed.py)."""
    embedded_draft = False  # the embedded pair's own drafter (its id follows the model's)
    target_path = locate_target(model)
    if model is None or model in EMBEDDED_PAIRS:
        model_id = model or EMBEDDED_MODEL
        embedded_draft = draft is None
        draft = draft or str(assets_dir() / EMBEDDED_PAIRS[model_id][1])
    else:
        model_id = model
        if draft is None and not no_draft:
            draft = draft_for(model)
    if pipeline is not None:
        from .distributed import load_pipeline_target

        target, tokenizer, config = load_pipeline_target(target_path, pipeline)
    else:
        target, tokenizer, config = load_target(target_path)
    drafter = None
    draft_id = None
    if draft is not None and not no_draft:
        draft_path = resolve_model_path(draft)
        info = TargetInfo.from_config(config, family=target.family)
        drafter = load_draft(draft_path, info)
        draft_id = f"{model_id}-dflash" if embedded_draft else draft
    else:
        log.warning("no_drafter", model=model_id, detail="serving target-only (AR)")
    text_config = config.get("text_config") or config
    max_ctx = int(text_config.get("max_position_embeddings", 32768))
    options = EngineOptions(
        mode="spec" if mode == "spec" else "ar",
        block_size=block_size,
        draft_length=draft_length,
        window=window or DraftWindow(),
        context_length=context_length,
        prefill_chunk=prefill_chunk_for(mx.default_device()),
    )
    cache = cache if cache is not None else CacheConfig()
    if pipeline is not None and cache.l2_dir is not None:
        # A pipeline's snapshots name state the other ranks keep in memory: nothing to save.
        log.warning("pipeline_no_l2", detail="the prefix cache's disk tier is off with a pipeline")
        cache = cache.model_copy(update={"l2_dir": None})
    prefix_cache = PrefixCache(cache) if cache.enabled else None
    return DFlashEngine(
        target,
        tokenizer,
        drafter,
        model_id,
        draft_id,
        max_ctx,
        options,
        prefix_cache,
        generation_defaults=read_generation_defaults(target_path),
    )
