"""Upstream pools: what routing a request through the gateway adds over calling the upstream
directly, measured side by side (direct and routed runs interleaved, same client, keep-alive).

    flock /tmp/bench.lock nice -n -15 python benchmarks/upstream_overhead.py [--repeats 30]

Two upstreams, each started here and stopped by PID: a canned OpenAI-compatible server that
answers at once (its chunks cost nothing, so the difference is the gateway's own cost: per
request and per streamed chunk), and `toolflash serve` with the embedded tiny model (a real
stream: the routed stream's time against the direct one's, in %). The gateway is
`toolflash serve --no-local-model --upstreams FILE`. Figures are medians of the per-pair
differences; targets (issue #35): <= 2 ms per request, streaming per-token overhead <= 3%.

Before and after in one sitting: `--baseline-commit REV` adds a second gateway, run from that
commit of this repository, measured in the same rounds (`*_baseline` figures), and each
`--variant NAME=REV[+plain]` one more (`*_NAME`; the order of the gateways alternates per round);
`--gateway-commit REV` runs the measured gateway from a commit instead of this working tree,
and `--upstream-commit REV` the tiny-model upstream (what is measured is the gateway: a fixed
upstream keeps work in progress in a shared tree out of the figures). `--plain-http ROLE` (and
`+plain`) hides uvloop and httptools from a process, so uvicorn runs asyncio's loop and h11 as
before they were dependencies. Beside the wall-time figures, `gateway_cpu_ms` is the CPU time
of each gateway process per call (all its threads), with its quartiles: other load on a shared
machine moves it far less than wall time. `--pin` puts the tiny-model upstream on a CPU of its
own and everything else on the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import tomllib
from script_env import ensure_optimized_blas_for_script

from toolflash.ports import free_port

CANNED = textwrap.dedent(
    """
    import json, sys, time
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def chunk(delta, finish=None, usage=None):
        c = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            c["usage"] = usage
        return "data: " + json.dumps(c) + "\\n\\n"

    async def completions(request):
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
        if not body.get("stream"):
            return JSONResponse({"id": "c", "object": "chat.completion", "created": 0,
                "model": "m", "usage": usage, "choices": [{"index": 0, "finish_reason":
                "length", "message": {"role": "assistant", "content": "tok " * n}}]})
        async def events():
            yield chunk({"role": "assistant", "content": ""})
            for _ in range(n):
                yield chunk({"content": "tok "})
            yield chunk({}, "length", usage)
            yield "data: [DONE]\\n\\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request):
        return JSONResponse({"status": "ok"})

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)
NO_EOS = {"2": -100}  # the tiny model's EOS: every stream decodes max_tokens tokens


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, int]:
    """Seconds to the whole answer (a stream read to [DONE]), and the content chunks read."""
    t0 = time.perf_counter()
    if not body.get("stream"):
        r = client.post(url, json=body)
        r.raise_for_status()
        return time.perf_counter() - t0, 1
    chunks = 0
    with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line.replace(" ", ""):
                chunks += 1
    return time.perf_counter() - t0, chunks


def cpu_ns(pid: int) -> int:
    """CPU time of process `pid` so far, all its threads (ns: /proc's schedstat, finer than
    the clock ticks of /proc/PID/stat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def spread(xs: list[float], scale: float, digits: int) -> dict[str, float]:
    """Median and quartiles of `xs` (times `scale`)."""
    q1, med, q3 = statistics.quantiles(xs, n=4) if len(xs) > 1 else (xs[0],) * 3
    return {
        "median": round(scale * med, digits),
        "p25": round(scale * q1, digits),
        "p75": round(scale * q3, digits),
    }


def pairs(
    client: httpx.Client,
    direct: str,
    routed: dict[str, str],
    body: dict[str, Any],
    model: str,
    n: int,
    pids: dict[str, int],
) -> dict[str, Any]:
    """n interleaved rounds of the same body: direct, then through each gateway of `routed`
    (name: URL; the order alternates per round); the medians and per-round deltas of each
    against the direct call, and the CPU time each gateway process (`pids`) spent on its call."""
    d_times: list[float] = []
    r_times: dict[str, list[float]] = {name: [] for name in routed}
    deltas: dict[str, list[float]] = {name: [] for name in routed}
    ratios: dict[str, list[float]] = {name: [] for name in routed}
    cpu: dict[str, list[float]] = {name: [] for name in routed}
    chunks: dict[str, int] = {}
    names = list(routed)
    for i in range(n + 2):
        d, _ = timed(client, f"{direct}/v1/chat/completions", body)
        times = {}
        for name in names if i % 2 else names[::-1]:
            c0 = cpu_ns(pids[name])
            times[name], chunks[name] = timed(
                client, f"{routed[name]}/v1/chat/completions", {**body, "model": model}
            )
            cpu[name].append((cpu_ns(pids[name]) - c0) / 1e9)
        if i < 2:  # warm-up: connections, first-request paths
            cpu = {name: [] for name in routed}
            continue
        d_times.append(d)
        for name, r in times.items():
            r_times[name].append(r)
            deltas[name].append(r - d)
            ratios[name].append(r / d - 1)
    out: dict[str, Any] = {"direct_median_ms": round(1e3 * statistics.median(d_times), 3)}
    for name in routed:
        suffix = "" if name == "gateway" else f"_{name}"
        out[f"routed_median_ms{suffix}"] = round(1e3 * statistics.median(r_times[name]), 3)
        out[f"overhead_median_ms{suffix}"] = round(1e3 * statistics.median(deltas[name]), 3)
        out[f"overhead_median_pct{suffix}"] = round(100 * statistics.median(ratios[name]), 2)
        out[f"overhead_pct_spread{suffix}"] = spread(ratios[name], 100, 2)
        out[f"overhead_ms_spread{suffix}"] = spread(deltas[name], 1e3, 3)
        # The gateway process's own CPU per call: what other load on the machine moves least.
        out[f"gateway_cpu_ms{suffix}"] = spread(cpu[name], 1e3, 3)
        out[f"routed_chunks{suffix}"] = chunks[name]  # the last round's
    out["runs"] = n
    return out


HIDDEN = "raise ImportError('hidden by benchmarks/upstream_overhead.py --plain-http')\n"


def hide_fast_http(into: Path) -> Path:
    """A folder that, first on PYTHONPATH, makes `import uvloop` and `import httptools` fail
    (uvicorn's "auto" loop and HTTP protocol then fall back to asyncio and h11)."""
    folder = into / "plain-http"
    for name in ("uvloop", "httptools"):
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "__init__.py").write_text(HIDDEN)
    return folder


def package_at(commit: str, into: Path) -> Path:
    """`commit` of this repository as an importable `toolflash` package: the directory to
    put first on PYTHONPATH (its top-level folders linked in as pyproject's package-dir maps
    them)."""
    tree, pkg = into / f"tree-{commit}", into / f"pkg-{commit}"
    if pkg.exists():
        return pkg
    tree.mkdir()
    archive = subprocess.run(["git", "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.copytree(tree / dirs["toolflash"], pkg / "toolflash")
    for name, folder in dirs.items():
        if name != "toolflash":
            (pkg / name.replace(".", "/")).symlink_to(tree / folder)
    return pkg


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--stream-tokens", type=int, default=256)
    p.add_argument("--json", default="benchmarks/results/upstream_overhead.json")
    p.add_argument("--baseline-commit", help="a second gateway from this commit, same rounds")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=REV[+plain]",
        help="one more gateway from commit REV ('tree': this working tree) in the same rounds"
        " (`*_NAME` figures); +plain hides uvloop and httptools from it (repeatable)",
    )
    p.add_argument("--gateway-commit", help="the measured gateway from this commit")
    p.add_argument("--upstream-commit", help="the tiny-model upstream from this commit")
    p.add_argument(
        "--pin",
        action="store_true",
        help="the tiny-model upstream on the last CPU of this process's set, every other"
        " process (gateways, canned upstream, this client) on the rest: the gateway then takes"
        " no CPU from the upstream's decode (as beside a GPU server), only adds its latency",
    )
    p.add_argument(
        "--stream-rounds",
        type=int,
        help="rounds of the tiny model's stream (default: a third of --repeats, at least 5)",
    )
    p.add_argument(
        "--plain-http",
        action="append",
        default=[],
        choices=("gateway", "baseline", "upstream"),
        help="run that process with uvloop and httptools hidden, so uvicorn picks asyncio's"
        " loop and h11 as it did before they were dependencies (repeatable)",
    )
    p.add_argument(
        "--stream-interval-ms",
        type=float,
        help="every gateway's --stream-interval-ms (unset: each gateway's default, which"
        " commits may differ on)",
    )
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="upstream-bench-"))
    procs: list[subprocess.Popen[bytes]] = []

    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        p.error("--pin needs two CPUs at least")
    decode_cpus, other_cpus = set(cpus[-1:]), set(cpus[:-1])
    if args.pin:
        os.sched_setaffinity(0, other_cpus)  # this client; the processes it starts inherit it

    def start(
        argv: list[str],
        name: str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        *,
        decode: bool = False,
    ) -> subprocess.Popen[bytes]:
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - the process owns it
        pin = None
        if args.pin and decode:
            pin = lambda: os.sched_setaffinity(0, decode_cpus)  # noqa: E731
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, preexec_fn=pin
        )
        procs.append(proc)
        return proc

    def from_commit(commit: str | None, role: str, plain: bool = False) -> dict[str, Any]:
        """A process's environment to import toolflash from `commit` (its package first on the
        path; run from elsewhere, so this working directory does not shadow it), with uvloop
        and httptools hidden for a `--plain-http` role."""
        path = [str(package_at(commit, tmp))] if commit else []
        if plain or role in args.plain_http:
            path.insert(0, str(hide_fast_http(tmp)))
        if not path:
            return {}
        rest = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path + ([rest] if rest else []))}
        return {"env": env, "cwd": str(tmp)}

    try:
        canned_port, tiny_port, gw_port = free_port(), free_port(), free_port()
        canned = f"http://127.0.0.1:{canned_port}"
        tiny = f"http://127.0.0.1:{tiny_port}"
        gateway = f"http://127.0.0.1:{gw_port}"
        cp = start([sys.executable, "-c", CANNED, str(canned_port)], "canned")
        tp = start(
            ["toolflash", "serve", "--port", str(tiny_port), "--policy", "off", "--mode", "ar"]
            + ["--no-calibrate", "--state-dir", str(tmp / "state"), "--log-level", "warning"],
            "tiny",
            **from_commit(args.upstream_commit, "upstream"),
            decode=True,
        )
        pools = {
            "pools": [
                {"model": "canned", "upstream_model": "m", "urls": [f"{canned}/v1"]},
                {
                    "model": "tiny",
                    "upstream_model": "toolflash-tiny-qwen35",
                    "urls": [f"{tiny}/v1"],
                },
            ]
        }
        (tmp / "upstreams.yaml").write_text(json.dumps(pools))
        gateways = {"gateway": gateway}
        serve = [
            "toolflash",
            "serve",
            "--no-local-model",
            "--upstreams",
            str(tmp / "upstreams.yaml"),
        ]
        if args.stream_interval_ms is not None:
            serve += ["--stream-interval-ms", str(args.stream_interval_ms)]
        waits = [(canned, cp), (tiny, tp)]
        gp = start(
            serve + ["--port", str(gw_port), "--log-level", "warning"],
            "gateway",
            **from_commit(args.gateway_commit, "gateway"),
        )
        waits.append((gateway, gp))
        pids = {"gateway": gp.pid}
        if args.baseline_commit:
            base_port = free_port()
            gateways["baseline"] = f"http://127.0.0.1:{base_port}"
            bp = start(
                serve + ["--port", str(base_port), "--log-level", "warning"],
                "baseline",
                **from_commit(args.baseline_commit, "baseline"),
            )
            waits.append((gateways["baseline"], bp))
            pids["baseline"] = bp.pid
        for spec in args.variant:
            name, _, rev = spec.partition("=")
            rev, plain = rev.removesuffix("+plain"), rev.endswith("+plain")
            port = free_port()
            gateways[name] = f"http://127.0.0.1:{port}"
            vp = start(
                serve + ["--port", str(port), "--log-level", "warning"],
                name,
                **from_commit(None if rev == "tree" else rev, name, plain),
            )
            waits.append((gateways[name], vp))
            pids[name] = vp.pid
        for url, proc in waits:
            wait_healthy(url, proc)
        msg = [{"role": "user", "content": "Count"}]
        out: dict[str, Any] = {
            "command": "python benchmarks/upstream_overhead.py " + " ".join(sys.argv[1:]),
            "repeats": args.repeats,
            "stream_tokens": args.stream_tokens,
            "gateway_commit": args.gateway_commit or "working tree",
            "baseline_commit": args.baseline_commit,
            "variants": args.variant,
            "upstream_commit": args.upstream_commit or "working tree",
            "stream_interval_ms": args.stream_interval_ms,
            "plain_http": args.plain_http,
            "pinned": {"upstream": sorted(decode_cpus), "others": sorted(other_cpus)}
            if args.pin
            else None,
        }
        with httpx.Client(timeout=120) as client:
            n = args.repeats
            out["canned_request"] = pairs(
                client,
                canned,
                gateways,
                {"model": "m", "messages": msg, "max_tokens": 1},
                "canned",
                n,
                pids,
            )
            out["canned_stream"] = pairs(
                client,
                canned,
                gateways,
                {"model": "m", "messages": msg, "max_tokens": args.stream_tokens, "stream": True},
                "canned",
                n,
                pids,
            )
            out["tiny_request"] = pairs(
                client,
                tiny,
                gateways,
                {"model": "toolflash-tiny-qwen35", "messages": msg, "max_tokens": 8},
                "tiny",
                n,
                pids,
            )
            out["tiny_stream"] = pairs(
                client,
                tiny,
                gateways,
                {
                    "model": "toolflash-tiny-qwen35",
                    "messages": msg,
                    "max_tokens": args.stream_tokens,
                    "stream": True,
                    "logit_bias": NO_EOS,
                },
                "tiny",
                args.stream_rounds or max(5, n // 3),
                pids,
            )
        c, t = out["canned_stream"], out["tiny_stream"]
        for suffix in ("" if name == "gateway" else f"_{name}" for name in gateways):
            out[f"gateway_us_per_streamed_token{suffix}"] = round(
                1e3 * c[f"overhead_median_ms{suffix}"] / args.stream_tokens, 2
            )
            # CPU the gateway process spends per relayed token (median call of each stream).
            for name, row in (("canned", c), ("tiny", t)):
                out[f"gateway_cpu_us_per_token_{name}{suffix}"] = round(
                    1e3 * row[f"gateway_cpu_ms{suffix}"]["median"] / args.stream_tokens, 2
                )
        out["load_1min"] = os.getloadavg()[0]
        print(json.dumps(out, indent=2))
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
        for tree in tmp.glob("tree-*"):  # the commits' checkouts (the logs stay)
            shutil.rmtree(tree, ignore_errors=True)
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    sys.exit(main())
