"""The adaptive policy's per-step cost: CPU time of `PolicyController.after_step` over recorded steps.

The steps (cycle records and the text each committed) are recorded once from the controller
deciding in a scripted world (per span kind: draft tokens a cycle accepts; per block: seconds per
cycle) and kept in `benchmarks/data/policy_steps.json`, so a change to the controller is timed
over the same steps. Each repetition replays every recorded request through fresh controllers of
one policy (the estimates learn as the requests go, as in a server) and sums the thread CPU time
of the `after_step` calls; the table gives the median over repetitions per step.

    nice -n -15 python benchmarks/policy_step.py [--record] [--reps 30] [--out FILE]
    nice -n -15 python benchmarks/policy_step.py --against 030c774   # interleaved A/B

`--against REV` times the policy package as of git revision REV (extracted beside, imported
under another name) against the working tree's, one repetition of each in turn.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.api import CycleRecord, GenerationStats
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig
from toolflash.policy.request_class import RequestClass
from toolflash.policy.spans import SpanTracker

DATA = Path(__file__).parent / "data" / "policy_steps.json"
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app/main.py"}}\n</tool_call>'
SCRIPTS = {
    "short-tool-turn": "I will read the file. " + CALL,
    "agent-turn": ("Reading the module first, then the plan for the fix. " * 4 + CALL) * 2,
    "long-text": "An explanation of the module that goes on for a while, line by line. " * 30,
}
ACCEPTED = {"text": 5, "tool_call": 1, "json": 1, "reasoning": 5}
CYCLE_S = {16: 0.012, 8: 0.010, 4: 0.008}
AR_S = 0.004
CLASS = RequestClass(kind="tools", thinking="off", after_tool_result=False, length_band="lt1k")


def _policy(tmp: Path) -> AdaptivePolicy:
    cfg = tmp / "cycle-timing.yaml"
    cfg.write_text("estimates: {timing: cycle}\n")
    return AdaptivePolicy(PolicyConfig([cfg]), clock=lambda: 1_000_000.0, persist=False)


def record(requests: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """Drive controllers of one policy through the scripts; keep each step's record and text."""
    rng = random.Random(seed)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        pol = _policy(Path(tmp))
        names = list(SCRIPTS)
        for i in range(requests):
            name = names[i % len(names)]
            script = SCRIPTS[name]
            tracker = SpanTracker()
            truth = [tracker.kind] + [tracker.push(c) for c in script[:-1]]
            ctrl = pol.controller_for("m", CLASS, False)
            decision = ctrl.start(300, 16)
            pos, idx, steps = 0, 0, []
            while pos < len(script):
                span = truth[pos]
                jitter = 1.0 + rng.uniform(-0.05, 0.05)
                if decision.mode == "spec":
                    block = decision.block_size
                    acc = min(ACCEPTED[span], block - 1, len(script) - pos - 1)
                    s = CYCLE_S[block] * jitter
                    rec = CycleRecord(
                        idx,
                        "spec",
                        block,
                        block - 1,
                        acc,
                        acc + 1,
                        s / 3,
                        2 * s / 3,
                        0.0,
                        300 + pos,
                    )
                else:
                    s = AR_S * jitter
                    rec = CycleRecord(idx, "ar", 1, 0, 0, 1, 0.0, s, 0.0, 300 + pos)
                text = script[pos : pos + rec.committed]
                steps.append([list(_fields(rec)), text])
                pos += rec.committed
                idx += 1
                decision = ctrl.after_step(rec, [0] * rec.committed, text)
            ctrl.finish(GenerationStats(300, 0, len(script), 0.0, 0.1, ()))
            out.append({"script": name, "steps": steps})
    return out


def _fields(rec: CycleRecord) -> tuple[Any, ...]:
    return (
        rec.index,
        rec.mode,
        rec.block_size,
        rec.drafted,
        rec.accepted,
        rec.committed,
        rec.draft_s,
        rec.verify_s,
        rec.rollback_s,
        rec.context_len,
    )


def replay(requests: list[dict[str, Any]], tmp: Path, make: Any = None) -> tuple[float, int]:
    """(CPU seconds in after_step, steps) for one pass of all requests through a fresh policy
    (`make(tmp)`, by default the working tree's)."""
    pol = (make or _policy)(tmp)
    cpu, n = 0.0, 0
    for req in requests:
        steps = [(CycleRecord(*f), t) for f, t in req["steps"]]
        ids = [[0] * r.committed for r, _ in steps]
        ctrl = pol.controller_for("m", CLASS, False)
        ctrl.prepare(300, 16)
        ctrl.start(300, 16)
        t0 = time.thread_time()
        for (rec, text), tok in zip(steps, ids, strict=True):
            ctrl.after_step(rec, tok, text)
        cpu += time.thread_time() - t0
        n += len(steps)
        ctrl.finish(GenerationStats(300, 0, len(steps), 0.0, 0.1, ()))
    return cpu, n


def policy_at(rev: str, into: Path) -> Any:
    """A `_policy`-like factory for the policy package as of git revision `rev`."""
    root = Path(__file__).resolve().parents[1]
    name = f"policy_{rev}"
    tar = subprocess.run(
        ["git", "archive", rev, "policy"], cwd=root, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    (into / "policy").rename(into / name)
    sys.path.insert(0, str(into))
    config = __import__(f"{name}.config", fromlist=["PolicyConfig"])
    try:  # AdaptivePolicy moved from controller.py to adaptive.py with #27
        controller = __import__(f"{name}.adaptive", fromlist=["AdaptivePolicy"])
    except ImportError:
        controller = __import__(f"{name}.controller", fromlist=["AdaptivePolicy"])

    # That revision's own shipped defaults: today's may hold keys it does not know.
    default = into / f"{name}-configs" / "default.yaml"
    default.parent.mkdir()
    default.write_bytes(
        subprocess.run(
            ["git", "show", f"{rev}:configs/default.yaml"], cwd=root, capture_output=True
        ).stdout
    )

    def make(tmp: Path) -> Any:
        cfg = tmp / "cycle-timing.yaml"
        cfg.write_text("estimates: {timing: cycle}\n")
        files = [default, cfg] if default.stat().st_size else [cfg]
        return controller.AdaptivePolicy(
            config.PolicyConfig(files, include_shipped=not default.stat().st_size),
            clock=lambda: 1_000_000.0,
            persist=False,
        )

    return make


def _figures(per_step: list[float], requests: list[dict[str, Any]], reps: int) -> dict[str, Any]:
    return {
        "requests": len(requests),
        "steps": sum(len(r["steps"]) for r in requests),
        "reps": reps,
        "us_per_step_median": round(statistics.median(per_step), 3),
        "us_per_step_min": round(min(per_step), 3),
        "us_per_step_p90": round(statistics.quantiles(per_step, n=10)[-1], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="re-record the steps first")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    ap.add_argument("--against", default=None, help="also time the policy at this git revision")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.record or not DATA.exists():
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(record()))
    requests = json.loads(DATA.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        variants: dict[str, Any] = {"working tree": None}
        if args.against:
            variants = {args.against: policy_at(args.against, Path(tmp)), **variants}
        per_step: dict[str, list[float]] = {name: [] for name in variants}
        for rep in range(args.reps + 1):  # the first is a warm-up
            for name, make in variants.items():
                cpu, n = replay(requests, Path(tmp), make)
                if rep:
                    per_step[name].append(cpu / n * 1e6)
    result: dict[str, Any] = {
        name: _figures(v, requests, args.reps) for name, v in per_step.items()
    }
    if not args.against:
        result = result["working tree"]
    result = {
        "benchmark": "benchmarks/policy_step.py",
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.machine()} {platform.processor() or ''} cores={os.cpu_count()}",
        "python": platform.python_version(),
        "timing": "thread CPU time of after_step",
        **result,
    }
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
