"""Joining a pipeline-parallel target: the MLX group, each rank's slice of the model, and the
serve loop of the ranks other than 0 (engine/targets/pipeline.py has the protocol).

Every rank is one process started by MLX's launcher (`mlx.launch --hostfile hosts.json ...`,
or anything that sets MLX_RANK and MLX_HOSTFILE as it does) with the same model. Each rank loads
the model lazily and reads only the weights of its own layers (rank 0 also the embedding, the
final norm and the head), so a target too big for one machine's memory fits across several.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import structlog

from .api import EngineError
from .targets.base import TargetAdapter
from .targets.pipeline import PipelineTarget, Stage, serve_stage, split_layers
from .targets.pipeline_ring import Ring, RingGroup, join

log = structlog.get_logger(__name__)

# How long rank 0 waits for the pipeline's answer to one forward before it declares a rank
# lost: far above any forward's time (a long prefill chunk of a large model over Ethernet).
DEFAULT_TIMEOUT_S = 120.0


# What mlx.launch sets for each backend besides MLX_RANK.
LAUNCH_ENV = {"ring": "MLX_HOSTFILE", "jaccl": "MLX_IBV_DEVICES"}


def launched(backend: str = "ring") -> bool:
    """Whether this process was started as a rank of `backend` (by mlx.launch or its
    equivalent)."""
    return "MLX_RANK" in os.environ and LAUNCH_ENV[backend] in os.environ


def init_group(timeout_s: float = DEFAULT_TIMEOUT_S, backend: str = "ring") -> RingGroup:
    """The group of the launched ranks (at least 2) over `backend` (ring or jaccl); over the
    ring, rank 0 declares the pipeline lost when an answer takes longer than `timeout_s`."""
    if not launched(backend):
        raise EngineError(
            "a distributed target needs its ranks started by mlx.launch "
            f"(`mlx.launch --hostfile hosts.json --backend {backend} -- toolflash serve "
            "--distributed hosts.json`)"
        )
    if not mx.distributed.is_available(backend):
        raise EngineError(f"this MLX build has no {backend} backend")
    group = join(timeout_s, backend)
    if group.size < 2:
        raise EngineError("a distributed target needs at least 2 ranks")
    log.info("pipeline.joined", rank=group.rank, ranks=group.size, ring_sockets=len(group.fds))
    return group


def load_stage(path: Path, group: RingGroup) -> tuple[Any, Any, dict, list[range]]:
    """This rank's family adapter (only its layers' weights read), the tokenizer, the config,
    and every rank's layer slice."""
    from .factory import load_target

    loaded = load_target(path, lazy=True)
    adapter: Any = loaded[0]  # a DecoderStack family adapter (its layers, head, embedding)
    tokenizer, config = loaded[1], loaded[2]
    slices = split_layers(adapter.num_layers, group.size)
    rank = group.rank
    owned = [adapter.layers[i].parameters() for i in slices[rank]]
    if rank == 0:
        inner = adapter.inner
        owned += [inner.embed_tokens.parameters(), inner.norm.parameters()]
        if not adapter.tied:
            owned.append(adapter.text.lm_head.parameters())
    mx.eval(owned)
    log.info("pipeline.stage_loaded", rank=rank, layers=[slices[rank].start, slices[rank].stop])
    return adapter, tokenizer, config, slices


def load_pipeline_target(path: Path, group: RingGroup) -> tuple[TargetAdapter, Any, dict]:
    """Rank 0's target over the group (the other ranks run `serve_rank`). Its caches are
    `PipelineCache`s, not lists: the session only hands them back to the target and to
    `export_cache` / `restore_cache`, which take them through their hooks."""
    adapter, tokenizer, config, slices = load_stage(path, group)
    return cast(TargetAdapter, PipelineTarget(adapter, group, slices)), tokenizer, config


def pipeline_failure(engines: list[Any]) -> str | None:
    """Why rank 0's pipeline can serve no more (a rank lost, or it was closed), from the engine
    `build_engine` made over it (`engines`: empty while it loads); None while it can."""
    if not engines:
        return None
    target = engines[0].target
    return target.failure if isinstance(target, PipelineTarget) else None


def serve_rank(model: str | None, group: RingGroup) -> int:
    """A rank other than 0: load its slice of `model` and serve rank 0 until it stops the
    pipeline (0) or a neighbour is lost (1)."""
    from .factory import locate_target

    if group.rank == 0:
        raise ValueError("rank 0 builds the engine; serve_rank is for the others")
    adapter, _, _, slices = load_stage(locate_target(model), group)
    stage = Stage(adapter, slices[group.rank])
    try:
        serve_stage(stage, Ring(group), slices, adapter.hidden_size)
    except (RuntimeError, EngineError) as exc:  # a neighbour closed its connection, or nonsense
        log.error("pipeline.rank_lost", rank=group.rank, detail=str(exc))
        return 1
    return 0
