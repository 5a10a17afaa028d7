"""Per-token cost of a pipeline-parallel target (engine/targets/pipeline.py) against the
single-process engine: the same prompts, greedy, in AR and in spec mode, on 1 (one process, no
pipeline), 2 and 4 ranks over loopback (MLX's ring backend, ranks started as mlx.launch starts
them), in one run, so the ratios are side by side.

Per configuration it reports the median AR step (ms), the median spec cycle (ms) and its
tokens per cycle, decode ms per token in each mode, and every ratio to 1 rank (medians over
rounds that interleave the configurations); and whether every output equals the single-process
one. A spec cycle crosses the pipeline once (its verify
block), like an AR step: the cost a pipeline adds per crossing is paid once per cycle either
way, which the ratio of spec to AR per token shows.

    flock /tmp/bench.lock nice -n -15 python benchmarks/distributed_pipeline.py \\
        --rounds 3 --out benchmarks/results/distributed_pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from script_env import ensure_optimized_blas_for_script

from toolflash.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = (
    "def add(a, b):",
    "The list of tools is",
    "Write a JSON object with a name and an age:",
)


def run_requests(engine: Any, prompts: list[list[int]], modes: list[str], spec: dict) -> dict:
    """Per mode: every request's outputs and cycle records (after one warm-up request)."""
    from toolflash.engine.api import FinishEvent, GenerationRequest, TokenEvent

    def one(prompt: list[int], mode: str) -> tuple[list[int], Any]:
        request = GenerationRequest(tuple(prompt), spec["max_tokens"], mode=mode, ignore_eos=True)  # type: ignore[arg-type]
        tokens: list[int] = []
        stats = None
        for event in engine.generate(request):
            if isinstance(event, TokenEvent):
                tokens.extend(event.token_ids)
            elif isinstance(event, FinishEvent):
                stats = event.stats
        return tokens, stats

    for mode in modes:
        one(prompts[0], mode)  # warm-up
    out: dict[str, Any] = {}
    for mode in modes:
        outputs, steps, decode_s, tokens = [], [], 0.0, 0
        for _ in range(spec["repeats"]):
            for prompt in prompts:
                toks, stats = one(prompt, mode)
                outputs.append(toks)
                steps += [(c.total_s, c.committed) for c in stats.cycles if c.mode == mode]
                decode_s += stats.decode_s
                tokens += stats.completion_tokens
        out[mode] = {
            "outputs": outputs,
            "step_ms_median": 1000 * statistics.median(s for s, _ in steps),
            "tokens_per_step": sum(n for _, n in steps) / len(steps),
            "decode_ms_per_token": 1000 * decode_s / tokens,
        }
    return out


def rank_main(spec: dict) -> int:
    """One process of a configuration: rank 0 (or the single process) runs the requests and
    prints the JSON result; other ranks serve their layers."""
    from toolflash.engine.distributed import init_group, serve_rank
    from toolflash.engine.factory import build_engine
    from toolflash.gateway.logs import configure_logging

    configure_logging(json_lines=False, level="warning")
    group = init_group() if spec["ranks"] > 1 else None
    if group is not None and group.rank != 0:
        return serve_rank(spec["model"], group)
    engine = build_engine(spec["model"], pipeline=group)
    prompts = [engine.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    result = run_requests(engine, prompts, spec["modes"], spec)
    if group is not None:
        engine.target.close()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def run_config(spec: dict) -> dict:
    """Start the configuration's processes and return rank 0's result."""
    ranks = spec["ranks"]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if ranks > 1:
            hostfile = Path(tmp) / "ring.json"
            hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(ranks)]))
            env["MLX_HOSTFILE"] = str(hostfile)
        command = [sys.executable, str(Path(__file__).resolve()), "--rank-worker", json.dumps(spec)]
        processes = [
            subprocess.Popen(
                command,
                cwd=ROOT,
                env={**env, "MLX_RANK": str(rank)} if ranks > 1 else env,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                text=True,
            )
            for rank in range(ranks)
        ]
        try:
            out, _ = processes[0].communicate(timeout=1800)
            codes = [p.wait(timeout=60) for p in processes]
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    if codes != [0] * ranks:
        raise RuntimeError(f"{ranks} ranks exited with {codes}")
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    result: dict = json.loads(line[len("RESULT ") :])
    return result


def merge_rounds(rounds: list[dict], modes: list[str]) -> dict:
    """One configuration's rounds: the median of each figure, the outputs of every round."""
    merged: dict[str, Any] = {}
    for mode in modes:
        runs = [r[mode] for r in rounds]
        merged[mode] = {
            key: statistics.median(run[key] for run in runs)
            for key in ("step_ms_median", "tokens_per_step", "decode_ms_per_token")
        }
        merged[mode]["outputs"] = [run["outputs"] for run in runs]
    return merged


def summary(rounds: dict[int, list[dict]], modes: list[str]) -> dict:
    """Per rank count: the figures (medians over rounds), their ratios to 1 rank, and whether
    every round's outputs equal the single process's first round's."""
    results = {ranks: merge_rounds(runs, modes) for ranks, runs in rounds.items()}
    base = results[1]
    out: dict[str, Any] = {}
    for ranks, res in results.items():
        row: dict[str, Any] = {}
        for mode in modes:
            m, b = res[mode], base[mode]
            row[mode] = {
                "step_ms_median": round(m["step_ms_median"], 3),
                "tokens_per_step": round(m["tokens_per_step"], 3),
                "decode_ms_per_token": round(m["decode_ms_per_token"], 3),
                "step_ratio_vs_1": round(m["step_ms_median"] / b["step_ms_median"], 3),
                "per_token_ratio_vs_1": round(
                    m["decode_ms_per_token"] / b["decode_ms_per_token"], 3
                ),
                "outputs_equal_to_1": all(o == b["outputs"][0] for o in m["outputs"]),
            }
        if "ar" in modes and "spec" in modes:
            row["spec_per_token_over_ar"] = round(
                res["spec"]["decode_ms_per_token"] / res["ar"]["decode_ms_per_token"], 3
            )
        out[str(ranks)] = row
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--models", default="toolflash-tiny-qwen3,toolflash-tiny-qwen35", help="comma-separated"
    )
    p.add_argument("--ranks", default="1,2,4", help="rank counts (1: one process, no pipeline)")
    p.add_argument("--modes", default="ar,spec")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3, help="each prompt's requests per mode")
    p.add_argument("--rounds", type=int, default=3, help="runs of every configuration")
    p.add_argument("--out", default=None, help="write the JSON here")
    p.add_argument("--rank-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_worker is not None:
        return rank_main(json.loads(args.rank_worker))
    modes = args.modes.split(",")
    counts = [int(x) for x in args.ranks.split(",")]
    if 1 not in counts:
        counts.insert(0, 1)
    by_model = {}
    for model in args.models.split(","):
        rounds: dict[int, list[dict]] = {ranks: [] for ranks in counts}
        for n in range(args.rounds):  # configurations interleaved, round after round
            for ranks in counts:
                spec = {
                    "model": model,
                    "ranks": ranks,
                    "modes": modes,
                    "max_tokens": args.max_tokens,
                    "repeats": args.repeats,
                }
                t0 = time.perf_counter()
                rounds[ranks].append(run_config(spec))
                took = time.perf_counter() - t0
                print(f"{model} round {n + 1} {ranks} rank(s): {took:.1f} s", file=sys.stderr)
        by_model[model] = summary(rounds, modes)
    report = {
        "benchmark": "distributed_pipeline",
        "command": " ".join(sys.argv),
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "prompts": [f"chat template, user: {p}" for p in PROMPTS],
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "figures": "medians over rounds of each round's median step and mean decode ms/token",
        "transport": "MLX ring backend over loopback TCP, all ranks on this machine",
        "results": by_model,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    sys.exit(main())
