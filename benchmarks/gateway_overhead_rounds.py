"""`gateway_overhead.py` for two commits in interleaved rounds: the before/after of a gateway
change measured in one sitting, each round running both (order alternating), so load that
drifts over the sitting hits both alike.

    flock /tmp/bench.lock nice -n -15 python benchmarks/gateway_overhead_rounds.py \
        --commit A --commit B --rounds 6 --json out.json -- \
        --max-tokens 128 --ignore-eos --repeats 2 --clients 0 --mode ar --stream-interval-ms 0

Each commit runs as an importable package of that commit (`upstream_overhead.package_at`, first
on PYTHONPATH), driven by this tree's `gateway_overhead.py`. Per figure: the median and
quartiles over rounds of each commit's value, and of the paired difference (later commit minus
the first) within each round, which the machine's drift moves least.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from script_env import ensure_optimized_blas_for_script
from upstream_overhead import package_at

SCRIPT = Path(__file__).with_name("gateway_overhead.py")
FIGURES = (
    "streaming.overhead_pct",
    "streaming.best_overhead_pct",
    "streaming.added_ms_per_token",
    "streaming.stream_vs_plain_ms_per_token",
    "streaming.added_server_cpu_pct",
    "streaming.loop_cpu_ms",
    "streaming.client_cpu_ms",
    "streaming.direct_ms_per_token",
    "non_streaming.overhead_pct",
    "non_streaming.loop_cpu_ms",
)


def figure(report: dict[str, Any], key: str) -> float:
    section, name = key.split(".")
    return float(report[section][name])


def spread(xs: list[float]) -> dict[str, Any]:
    q1, med, q3 = statistics.quantiles(xs, n=4) if len(xs) > 1 else (xs[0],) * 3
    return {"median": round(med, 4), "p25": round(q1, 4), "p75": round(q3, 4), "rounds": xs}


def run_once(pkg: Path, args: list[str], out: Path) -> dict[str, Any]:
    rest = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg), *([rest] if rest else [])])}
    cmd = [sys.executable, str(SCRIPT), *args, "--json", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=pkg.parent, capture_output=True, text=True)
    if proc.returncode != 0:  # 1 also means a token mismatch: the report says which
        sys.stderr.write(proc.stderr[-3000:])
        if not out.exists():
            raise RuntimeError(f"gateway_overhead.py failed ({proc.returncode})")
    return json.loads(out.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--commit", action="append", required=True, help="a commit (repeat: 2+)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--json", default=None)
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: gateway_overhead.py's")
    args = p.parse_args()
    bench = [a for a in args.bench_args if a != "--"]
    commits = [
        subprocess.run(
            ["git", "rev-parse", "--short", c], capture_output=True, text=True, check=True
        ).stdout.strip()
        for c in args.commit
    ]
    reports: dict[str, list[dict[str, Any]]] = {c: [] for c in commits}
    started = time.strftime("%H:%M", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="gw-rounds-") as tmp:
        pkgs = {c: package_at(c, Path(tmp)) for c in commits}
        for r in range(args.rounds):
            order = commits if r % 2 == 0 else commits[::-1]
            for c in order:
                report = run_once(pkgs[c], bench, Path(tmp) / f"r{r}-{c}.json")
                reports[c].append(report)
                print(
                    f"round {r + 1}/{args.rounds} {c}: streaming"
                    f" {figure(report, 'streaming.overhead_pct'):+.2f}%, loop CPU"
                    f" {figure(report, 'streaming.loop_cpu_ms'):.1f} ms, load"
                    f" {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    first = commits[0]
    out: dict[str, Any] = {
        "benchmark": "gateway_overhead rounds",
        "command": "python benchmarks/gateway_overhead_rounds.py "
        + " ".join(f"--commit {c}" for c in args.commit)
        + f" --rounds {args.rounds} -- "
        + " ".join(bench),
        "utc": f"{time.strftime('%Y-%m-%d', time.gmtime())} {started}-"
        f"{time.strftime('%H:%M', time.gmtime())}",
        "commits": commits,
        "figures": {
            c: {k: spread([figure(rep, k) for rep in reports[c]]) for k in FIGURES} for c in commits
        },
        "paired_difference": {
            f"{c}-{first}": {
                k: spread(
                    [
                        round(figure(b, k) - figure(a, k), 4)
                        for a, b in zip(reports[first], reports[c], strict=True)
                    ]
                )
                for k in FIGURES
            }
            for c in commits[1:]
        },
        "token_mismatches": {c: [rep["token_mismatches"] for rep in reports[c]] for c in commits},
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    sys.exit(main())
