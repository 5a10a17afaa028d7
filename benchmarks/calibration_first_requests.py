"""The adaptive policy's first requests on a fresh server, with and without calibration.

The agent workload (`agent_workload.py`: multi-turn sessions of tool calls, tool results, free
text, code, forced calls and JSON answers; none of its prompts is a calibration prompt) runs
once per repetition, as the first requests a new server sees, under four strategies interleaved
request by request in balanced orders: always-spec, always-AR, the adaptive policy from an empty
state (`cold`: what a server without calibration does) and the adaptive policy from the state
`toolflash calibrate` seeded (`calibrated`). Each repetition starts both policies afresh (the
cold one empty, the calibrated one from a copy of the calibrated state) and lets them learn
online from the pass, as a server would. Greedy decoding: all four outputs must be identical.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \\
        python benchmarks/calibration_first_requests.py --reps 6 [--model DIR --draft DIR]

Writes `calibration_first_requests.json` to --out: decode tok/s per class and strategy (tokens
over decode seconds, pooled over repetitions), and the calibration's own wall time.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_workload import balanced_orders, build_workload, class_name, generate  # noqa: E402
from script_env import ensure_optimized_blas_for_script

from toolflash.policy.adaptive import AdaptivePolicy  # noqa: E402
from toolflash.policy.config import PolicyConfig  # noqa: E402

STRATEGIES = ("spec", "ar", "cold", "calibrated")


def _policy(state_file: Path, extra: list[str]) -> AdaptivePolicy:
    return AdaptivePolicy(PolicyConfig(extra), state_file=str(state_file))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import mlx.core as mx

    from toolflash.calibrate import ensure_calibrated
    from toolflash.engine.factory import build_engine

    engine = build_engine(args.model, args.draft)
    workload = build_workload(engine)
    root = Path(tempfile.mkdtemp(prefix="calibration-ab-"))
    seeded = root / "calibrated" / "policy-state.json"
    t0 = time.perf_counter()
    record, _ = ensure_calibrated(engine, _policy(seeded, args.policy), force=True)
    calibrate_s = time.perf_counter() - t0
    orders = balanced_orders(len(STRATEGIES))
    rows: list[dict[str, Any]] = []
    mismatches = 0
    n = 0
    for rep in range(args.reps):
        fresh = root / f"rep{rep}"
        (fresh / "cal").mkdir(parents=True)
        shutil.copy(seeded, fresh / "cal" / "policy-state.json")
        policies = {
            "cold": _policy(fresh / "cold" / "policy-state.json", args.policy),
            "calibrated": _policy(fresh / "cal" / "policy-state.json", args.policy),
        }
        for item in workload:
            order = [STRATEGIES[i] for i in orders[n % len(orders)]]
            n += 1
            results = {}
            for s in order:
                gc.collect()
                mx.clear_cache()
                policy = policies.get(s)
                strategy = "adaptive" if policy is not None else s
                results[s] = generate(engine, item, strategy, args.max_tokens, policy)
            if len({tuple(r.tokens) for r in results.values()}) != 1:
                mismatches += 1
            for s, r in results.items():
                rows.append(
                    {
                        "rep": rep,
                        "session": item.session,
                        "turn": item.turn,
                        "class": class_name(item.request_class),
                        "strategy": s,
                        "completion_tokens": r.completion_tokens,
                        "decode_s": r.decode_s,
                        "spec_cycles": r.spec_cycles,
                        "cycles": r.cycles,
                        "start": _start(r.summary),
                    }
                )
    return {
        "model": engine.model_id,
        "draft": engine.draft_id,
        "reps": args.reps,
        "requests_per_rep": len(workload),
        "max_tokens": args.max_tokens,
        "calibrate_s": round(calibrate_s, 1),
        "calibration_machine": dict(record.key.machine),
        "mismatches": mismatches,
        "table": table(rows),
        "rows": rows,
    }


def _start(summary: dict[str, Any] | None) -> str | None:
    """The arm a policy started the request with (None for the fixed modes)."""
    if not summary or not summary["decisions"]:
        return None
    d = summary["decisions"][0]
    return f"{d['mode']}{d['block_size'] or ''} ({d['kind']})"


def table(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """tok/s per class (and `all`) per strategy: tokens over decode seconds, pooled."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        for group in (r["class"], "all"):
            cell = sums.setdefault(group, {}).setdefault(r["strategy"], [0.0, 0.0])
            cell[0] += r["completion_tokens"]
            cell[1] += r["decode_s"]
    return {
        g: {s: round(t / d, 1) if d else 0.0 for s, (t, d) in cells.items()}
        for g, cells in sums.items()
    }


def format_table(rep: dict[str, Any]) -> str:
    lines = [
        f"model={rep['model']} reps={rep['reps']} requests/rep={rep['requests_per_rep']} "
        f"calibrate={rep['calibrate_s']} s mismatches={rep['mismatches']}",
        f"{'class':<34} "
        + " ".join(f"{s:>10}" for s in STRATEGIES)
        + f" {'cold/best':>9} {'cal/best':>9}",
    ]
    for group, cells in sorted(rep["table"].items(), key=lambda kv: (kv[0] == "all", kv[0])):
        best = max(cells["spec"], cells["ar"]) or 1.0
        lines.append(
            f"{group:<34} "
            + " ".join(f"{cells[s]:>10.1f}" for s in STRATEGIES)
            + f" {cells['cold'] / best:>8.2f}x {cells['calibrated'] / best:>8.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--draft", default=None)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--policy", action="append", default=[], help="extra policy YAML file(s)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    rep = run(args)
    print(format_table(rep))
    out = Path(args.out) / "calibration_first_requests.json"
    out.write_text(json.dumps(rep, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    sys.exit(main())
