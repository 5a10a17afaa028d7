"""The pipeline-parallel target (engine/targets/pipeline.py) against the single-process engine:
2 and 4 local processes over loopback (MLX's ring backend, started as mlx.launch starts them:
MLX_RANK and a MLX_HOSTFILE of free ports), both target families, greedy, token for token, in
AR, spec, scripted switches, lookup and under the adaptive policy; and a rank killed between
requests gives rank 0 a clear error, not a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from toolflash.engine.targets.pipeline import (
    FORWARD,
    Command,
    carried_layers,
    result_rows,
    split_layers,
)
from toolflash.ports import free_port

from .distributed_rank import run_request

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS = 16
PROMPTS = ("def add(a, b):", "The list of tools is")


def test_split_layers_is_contiguous_and_even() -> None:
    assert split_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert split_layers(4, 4) == [range(i, i + 1) for i in range(4)]
    assert split_layers(7, 3) == [range(0, 2), range(2, 4), range(4, 7)]
    with pytest.raises(ValueError):
        split_layers(2, 3)


def test_command_round_trips_and_payload_widths() -> None:
    cmd = Command(FORWARD, 3, 5, 0, True, False, 7, 2, (1, 2, 3))
    assert Command.decode(cmd.encode()) == cmd
    slices = split_layers(4, 4)
    assert carried_layers((1, 2, 3), slices, 1) == []  # rank 0 keeps its own layers
    assert carried_layers((1, 2, 3), slices, 3) == [1, 2]
    assert carried_layers((1, 2, 3), slices, 4) == [1, 2, 3]  # back at rank 0
    assert result_rows(Command(FORWARD, tokens=9, last_only=True), slices) == 1
    assert result_rows(Command(FORWARD, tokens=9, last_only=True, capture=(2,)), slices) == 9


def test_a_rank_reads_only_its_own_weights() -> None:
    """The last of 4 ranks materialises its layer, not the embedding, the head or the other
    layers (the model is loaded lazily; MLX's active memory counts what was read)."""
    from types import SimpleNamespace

    import mlx.core as mx

    from toolflash.engine.distributed import load_stage
    from toolflash.engine.factory import load_target, locate_target

    path = locate_target("toolflash-tiny-qwen3")
    before = mx.get_active_memory()
    adapter, _, _, slices = load_stage(path, SimpleNamespace(rank=3, size=4))  # type: ignore[arg-type]
    stage = mx.get_active_memory() - before
    full, _, _ = load_target(path)
    whole = mx.get_active_memory() - before - stage
    assert slices[3] == range(3, 4)
    assert 0 < stage < whole / 4


def test_calibrations_of_a_pipeline_are_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0's machine identity names the ring (addresses, not the per-launch ports), so a
    single-process calibration is never reused by a pipeline, nor one pipeline's by another."""
    from toolflash.calibration_key import machine_identity

    alone = machine_identity()
    assert "pipeline" not in alone
    ring = tmp_path / "ring.json"
    ring.write_text(json.dumps([["127.0.0.1:5000"], ["10.0.0.2:5001", "10.0.1.2:5002"]]))
    monkeypatch.setenv("MLX_RANK", "0")
    monkeypatch.setenv("MLX_HOSTFILE", str(ring))
    split = machine_identity()
    assert split["pipeline"] == "2 ranks: 127.0.0.1 | 10.0.0.2,10.0.1.2"
    assert {k: v for k, v in split.items() if k != "pipeline"} == alone


def start_ranks(tmp: Path, ranks: int, spec: Mapping[str, Any]) -> list[subprocess.Popen]:
    """The ranks of a local pipeline, as mlx.launch would start them on one host."""
    hostfile = tmp / f"ring-{ranks}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(ranks)]))
    command = [sys.executable, "-m", "tests.engine.distributed_rank", json.dumps(spec)]
    env = {**os.environ, "MLX_HOSTFILE": str(hostfile)}
    return [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "MLX_RANK": str(rank)},
            stdin=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
            stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for rank in range(ranks)
    ]


def stop(processes: Sequence[subprocess.Popen]) -> None:
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def requests_for(engine: Any) -> list[dict[str, Any]]:
    """Each prompt in AR, spec, spec with switches to AR and back, lookup, and under the
    policy (the first request snapshots the prompt's head, the others restore it)."""
    out: list[dict[str, Any]] = []
    for text in PROMPTS:
        prompt = engine.encode(text)
        base = {"prompt": prompt, "max_tokens": MAX_TOKENS}
        out += [
            {**base, "mode": "ar", "publish_at": [len(prompt) - 2]},
            {**base, "mode": "spec"},
            {**base, "mode": "spec", "plan": {"1": "ar", "3": "spec", "4": "ar", "6": "spec"}},
            {**base, "mode": "lookup"},
            {**base, "mode": "spec", "policy": True},
        ]
    return out


@pytest.fixture(scope="module", params=["toolflash-tiny-qwen3", "toolflash-tiny-qwen35"])
def reference(
    request: Any,
) -> Iterator[tuple[str, list[dict[str, Any]], list[list[int]], dict[str, Any]]]:
    """The single-process engine's outputs for every request."""
    from toolflash.engine.factory import build_engine

    engine = build_engine(request.param)
    requests = requests_for(engine)
    results = [run_request(engine, r) for r in requests if not r.get("policy")]
    outputs = [r["tokens"] for r in results]
    by_prompt = {tuple(r["prompt"]): o for r, o in zip(requests, outputs) if r["mode"] == "ar"}
    # Greedy decoding is lossless in every mode: the policy's output is the AR output.
    expected = [by_prompt[tuple(r["prompt"])] for r in requests]
    yield request.param, requests, expected, results[0]


@pytest.mark.parametrize("ranks", [2, 4])
def test_pipeline_matches_single_process(
    reference: tuple[str, list[dict[str, Any]], list[list[int]], dict[str, Any]],
    ranks: int,
    tmp_path: Path,
) -> None:
    model, requests, expected, first = reference
    assert all(len(tokens) == MAX_TOKENS for tokens in expected)
    processes = start_ranks(tmp_path, ranks, {"model": model, "requests": requests})
    try:
        out, _ = processes[0].communicate(timeout=120)
        codes = [p.wait(timeout=30) for p in processes]
    finally:
        stop(processes)
    got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert codes == [0] * ranks
    assert [g["tokens"] for g in got] == expected
    # Snapshots crossed the pipeline: every request after a prompt's first restored its head.
    assert [g["cached"] > 0 for g in got] == [i % 5 > 0 for i in range(len(requests))]
    # The prefix cache's byte budget counts every rank's share of a snapshot: the same bytes
    # as the single process's, plus the 8-byte reference to the other ranks' shares.
    assert got[0]["l1_entries"] == first["l1_entries"] > 0
    assert got[0]["l1_bytes"] == first["l1_bytes"] + 8 * first["l1_entries"]


@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_lost_rank_is_a_clear_error(fault: str, tmp_path: Path) -> None:
    """A rank that dies (its sockets close) or stops answering (SIGSTOP: alive, silent) between
    two requests: rank 0's next request ends in PipelineError, within the timeout."""
    from toolflash.engine.factory import build_engine

    engine = build_engine("toolflash-tiny-qwen3")
    request = {"prompt": engine.encode(PROMPTS[0]), "max_tokens": MAX_TOKENS, "mode": "spec"}
    spec = {
        "model": "toolflash-tiny-qwen3",
        "requests": [request, request],
        "wait_after": 1,
        "timeout_s": 3,
    }
    processes = start_ranks(tmp_path, 2, spec)
    try:
        rank0 = processes[0]
        assert rank0.stdout is not None and rank0.stdin is not None
        first = json.loads(rank0.stdout.readline())
        assert first["tokens"] == run_request(engine, request)["tokens"]
        assert rank0.stdout.readline().strip() == "ready"
        if fault == "killed":
            processes[1].kill()
            processes[1].wait(timeout=10)
        else:
            processes[1].send_signal(signal.SIGSTOP)
        rank0.stdin.write("go\n")
        rank0.stdin.flush()
        out, _ = rank0.communicate(timeout=30)  # an error within the timeout, no hang
        failure = json.loads(out.splitlines()[-1])
    finally:
        if fault == "stopped":
            processes[1].send_signal(signal.SIGCONT)
        stop(processes)
    assert failure["error"] == "PipelineError"
    assert failure["detail"].startswith("pipeline rank lost: ")
    if fault == "stopped":
        assert "no answer from rank 1 within 3 s" in failure["detail"]
    assert rank0.returncode == 0
