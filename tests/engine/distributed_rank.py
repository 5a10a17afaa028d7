"""One rank of a local pipeline for tests/engine/test_distributed.py, started with MLX_RANK and
MLX_HOSTFILE set as mlx.launch sets them. Rank 0 builds the engine over the pipeline, runs the
requests given as JSON (argv[1]) and prints each one's `run_request` as a JSON line; the other
ranks serve their layers until rank 0 closes the pipeline.

With "wait_after" in the spec, rank 0 prints "ready" after that many requests and reads a line
from stdin before the rest (the test kills or stops a rank in between), then prints the error
it met. "timeout_s": how long rank 0 waits for the pipeline's answer."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from toolflash.engine.api import EngineError, FinishEvent, GenerationRequest, TokenEvent


def run_request(engine: Any, spec: Mapping[str, Any], policy: Any = None) -> dict[str, Any]:
    """The output tokens of one request, the prompt tokens restored from the prefix cache, and
    the cache's memory tier after it (entries, bytes): {"prompt": ids, "mode", "max_tokens", "plan": {cycle: mode}, "policy": bool (the adaptive
    policy chooses the modes), "publish_at": prompt positions to snapshot}."""
    request = GenerationRequest(
        tuple(spec["prompt"]),
        int(spec["max_tokens"]),
        mode=spec.get("mode", "spec"),
        mode_plan={int(k): v for k, v in spec.get("plan", {}).items()},
        ignore_eos=True,
        publish_at=tuple(spec.get("publish_at", ())),
    )
    controller = None
    if spec.get("policy"):
        from toolflash.policy.request_class import RequestClass

        klass = RequestClass(
            kind="chat", thinking="off", after_tool_result=False, length_band="lt1k"
        )
        controller = policy.controller_for(engine.model_id, klass, False)
    tokens: list[int] = []
    cached = 0
    for event in engine.generate(request, controller=controller):
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            cached = event.stats.cached_tokens
    stats = engine.prefix_cache.stats()
    return {
        "tokens": tokens,
        "cached": cached,
        "l1_entries": stats["l1_entries"],
        "l1_bytes": stats["l1_bytes"],
    }


def adaptive_policy(state_dir: str) -> Any:
    from toolflash.commands.options import adaptive_policy as build

    return build([], state_dir)


def main() -> int:
    from toolflash.engine.distributed import init_group, serve_rank
    from toolflash.engine.factory import build_engine
    from toolflash.gateway.logs import configure_logging

    configure_logging(json_lines=False, level="warning")  # stderr: stdout carries the outputs
    spec = json.loads(sys.argv[1])
    group = init_group(float(spec.get("timeout_s", 60.0)))
    if group.rank != 0:
        return serve_rank(spec["model"], group)
    engine = build_engine(spec["model"], pipeline=group)
    policy = adaptive_policy(tempfile.mkdtemp(prefix="tf-dist-policy-"))
    wait_after = spec.get("wait_after")
    try:
        for n, request in enumerate(spec["requests"]):
            if n == wait_after:
                print("ready", flush=True)
                sys.stdin.readline()
            print(json.dumps(run_request(engine, request, policy)), flush=True)
    except EngineError as exc:
        print(json.dumps({"error": type(exc).__name__, "detail": str(exc)}), flush=True)
        # MLX's ring teardown at exit may wait on a peer that stopped answering.
        os._exit(0)
    engine.target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
