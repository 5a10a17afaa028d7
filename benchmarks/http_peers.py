r"""toolflash against the MLX servers its users would run instead, over HTTP (issue #25):
`mlx_lm.server` (the 1.00x line) and mlx-dspark 0.20.3 (auto/lookup and DFlash) on the same
target weights, each a subprocess on its own loopback port, requests interleaved.

    python benchmarks/http_peers.py            # the default rows of benchmarks/data/http_peers.json
    python benchmarks/http_peers.py --servers mlx-lm,toolflash --per-kind 2 --repeats 2
    python benchmarks/http_peers.py --model toolflash-tiny-qwen3 --no-stream   # the other pair,
                                                                   # complete responses
    python benchmarks/http_peers.py --dspark-python V/bin/python --servers \
        mlx-lm,toolflash,dspark-auto,dspark-dflash,mlx-lm-bf16         # all rows
    flock /tmp/bench.lock nice -n -10 python benchmarks/http_peers.py ...   # for figures

mlx-dspark rows run where `--dspark-python` (default: this interpreter) imports `mlx_dspark`.
Its wheel is pure Python; `pip install mlx-dspark==0.20.3` also pulls mlx-vlm's and mlx-audio's
dependencies (opencv, datasets, pandas, ...), which the server does not need, so a side
environment keeps them out of this one:

    python -m venv --system-site-packages V
    V/bin/pip install --no-deps mlx-dspark==0.20.3 mlx-vlm==0.7.10

Every server gets the same streamed chat requests (greedy, `max_tokens` 128, the prompts of
`toolflash/assets/tiny/bench_prompts.jsonl`, a few per kind, tools with tool-call prompts),
one at a time, round-robin over the servers per prompt in a seeded shuffled order, several
repetitions (the same prompts each time, so later repetitions meet each server's prefix cache).
With `--no-stream` the same requests ask for complete responses (`stream: false`), and only
end to end is timed. Per streamed request: TTFT (first content, reasoning or tool-call delta), streamed decode (tokens after
the first delta over the time from it to the last delta: `stream_options.include_usage`'s count
times the share of the output's characters that came after the first delta, since a speculative
server's first delta can hold several tokens; a stream whose first delta holds most of the
output, such as a tool call buffered to the end, times no decode and is left out of the decode
ratios) and end to end (request sent -> stream closed). Reported per kind and pooled: each
server's ratio to the baseline's (decode: pooled tok/s over pooled tok/s; end to end: the
baseline's summed time over the server's, on the same requests), the spread of the per-repetition
ratios, and how many outputs equal the baseline's.

Dtype: toolflash computes in float32 on the CPU (weights stored bf16, upcast at load), so the
peers get a float32 copy of the target made once with mlx-lm's own converter; the optional
`mlx-lm-bf16` row runs the stored bf16 weights and is labelled so. Servers start one after
another (toolflash calibrates on its first serve and must not share the CPU with another's
start-up), are stopped by PID at the end or on error, and inherit this process's environment
plus OpenBLAS (`LD_PRELOAD`, `OPENBLAS_NUM_THREADS`) and its nice value. toolflash is started
with `tool_call_format` among its allowed template kwargs, which the tool-call prompts set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from http_peers_report import (  # the script's folder is on sys.path
    Record,
    StreamResult,
    format_table,
    parse_body,
    parse_stream,
    summarize,
)
from script_env import ensure_optimized_blas_for_script

from toolflash.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "http_peers.json"
OUT = Path(__file__).parent / "results" / "http_peers.json"
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


# --- servers -------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    label: str
    argv: list[str]
    model: str
    baseline: bool
    log: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    health: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start(server: Server, env: Mapping[str, str], timeout_s: float) -> None:
    """Start the server and wait until `/health` answers 200 (each of the three answers it
    only once its model is loaded)."""
    import httpx

    log = server.log.open("wb")
    server.proc = subprocess.Popen(
        server.argv, cwd=ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited ({server.proc.returncode}):\n{tail(server)}")
        try:
            r = httpx.get(f"{server.url}/health", timeout=2)
            if r.status_code == 200:
                server.health = r.json()
                return
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{server.name} not healthy after {timeout_s} s:\n{tail(server)}")


def stop(server: Server) -> None:
    proc = server.proc
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)  # its own PID only
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def tail(server: Server, n: int = 3000) -> str:
    try:
        return server.log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextmanager
def running(servers: Sequence[Server], env: Mapping[str, str], timeout_s: float) -> Iterator[None]:
    """Start the servers one after another; stop every started one on the way out, also on
    an error or SIGTERM."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for s in servers:
            s.port = free_port()
            s.argv = [a.replace("{port}", str(s.port)) for a in s.argv]
            t = time.perf_counter()
            print(f"starting {s.name} on :{s.port} ...", file=sys.stderr, flush=True)
            start(s, env, timeout_s)
            print(f"  {s.name} ready in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        yield
    finally:
        for s in servers:
            stop(s)
        signal.signal(signal.SIGTERM, previous)


def float32_copy(src: Path, dst: Path, env: Mapping[str, str]) -> None:
    """The target's weights as float32, by mlx-lm's own converter (run once per invocation)."""
    subprocess.run(
        [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(src), "--mlx-path",
         str(dst), "--dtype", "float32"],
        check=True, env=dict(env), capture_output=True,
    )  # fmt: skip


# --- requests ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    kind: str
    index: int  # line in the prompts file
    body: dict[str, Any]  # the request's messages, tools and chat_template_kwargs


def load_prompts(spec: Mapping[str, Any], per_kind: int) -> tuple[list[Prompt], list[Prompt]]:
    """(measured, warm-up): `per_kind` prompts of each kind spread evenly over the kind's lines,
    and for the warm-up pass the `warmup_per_kind` lines after the first few of them."""
    lines = (ROOT / spec["file"]).read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    measured: list[Prompt] = []
    warmup: list[Prompt] = []
    for kind in spec["kinds"]:
        mine = [(i, r) for i, r in enumerate(rows) if r["kind"] == kind]
        step = max(len(mine) // max(per_kind, 1), 2)
        for j, (i, r) in enumerate(mine):
            body = {"messages": r["messages"]}
            for key in ("tools", "chat_template_kwargs"):
                if r.get(key) is not None:
                    body[key] = r[key]
            if j % step == 0 and j // step < per_kind:
                measured.append(Prompt(kind, i, body))
            elif j % step == 1 and j // step < spec["warmup_per_kind"]:
                warmup.append(Prompt(kind, i, body))
    return measured, warmup


def send(
    client: Any, server: Server, prompt: Prompt, request: Mapping[str, Any], stream: bool = True
) -> StreamResult:
    body: dict[str, Any] = {"model": server.model, **prompt.body, **request, "stream": stream}
    t0 = time.perf_counter()
    if not stream:
        try:
            r = client.post(f"{server.url}/v1/chat/completions", json=body)
            data = r.json()
        except Exception as exc:  # one failed request is a counted error, not a dead benchmark
            return StreamResult(time.perf_counter() - t0, error=repr(exc))
        res = parse_body(data, t0, time.perf_counter())
        if r.status_code != 200 and res.error is None:
            res.error = f"{r.status_code} {r.text}"
        return res
    body["stream_options"] = {"include_usage": True}
    lines: list[tuple[float, str]] = []
    try:
        with client.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                return StreamResult(time.perf_counter() - t0, error=f"{r.status_code} {r.text}")
            for line in r.iter_lines():
                lines.append((time.perf_counter(), line))
    except Exception as exc:  # one failed request is a counted error, not a dead benchmark
        return StreamResult(time.perf_counter() - t0, error=repr(exc))
    return parse_stream(lines, t0, time.perf_counter())


def to_record(
    server: str, prompt: Prompt, rep: int, res: StreamResult, ref: StreamResult, is_base: bool
) -> Record:
    """One request's record, its output compared with the baseline's (`ref`)."""
    text, calls = res.canonical_parts()
    ref_text, ref_calls = ref.canonical_parts()
    same = res.canonical() == ref.canonical()
    return Record(
        server=server,
        kind=prompt.kind,
        prompt=prompt.index,
        rep=rep,
        ttft_s=res.ttft_s,
        decode_s=res.decode_s,
        decode_tokens=round(res.decode_tokens, 3),
        decode_timed=res.decode_timed,
        e2e_s=res.e2e_s,
        completion_tokens=res.completion_tokens,
        cached_tokens=res.cached_tokens,
        finish_reason=res.finish_reason,
        identical=same,
        prefix_identical=calls == ref_calls
        and (text.startswith(ref_text) or ref_text.startswith(text)),
        same_length=res.completion_tokens == ref.completion_tokens,
        error=res.error,
        output=res.canonical() if is_base or not same else None,
    )


def interleaved(
    servers: Sequence[Server],
    prompts: Sequence[Prompt],
    warmup: Sequence[Prompt],
    request: Mapping[str, Any],
    repeats: int,
    seed: int,
    stream: bool = True,
) -> list[Record]:
    import httpx

    rng = random.Random(seed)
    base = next(s for s in servers if s.baseline)
    records = []
    with httpx.Client(timeout=600) as client:
        for p in warmup:  # first-call compilation, allocators; not measured
            for s in servers:
                send(client, s, p, request, stream)
        for rep in range(repeats):
            order = list(prompts)
            rng.shuffle(order)
            for p in order:
                turn = list(servers)
                rng.shuffle(turn)
                results = {s.name: send(client, s, p, request, stream) for s in turn}
                ref = results[base.name]
                for s in servers:
                    records.append(to_record(s.name, p, rep, results[s.name], ref, s is base))
            print(f"  repetition {rep + 1}/{repeats} done", file=sys.stderr, flush=True)
    return records


# --- main ----------------------------------------------------------------------------------


def versions(dspark_python: str | None) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("toolflash", "mlx", "mlx-lm", "httpx"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    if dspark_python:
        code = "import importlib.metadata as m; print(m.version('mlx-dspark'))"
        r = subprocess.run([dspark_python, "-c", code], capture_output=True, text=True)
        out["mlx-dspark"] = r.stdout.strip() or "?"
    return out


def tree() -> dict[str, Any]:
    """The toolflash tree measured: its commit and the files changed since (a shared working
    tree runs uncommitted work)."""

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout

    changed = [line[3:] for line in git("status", "--porcelain", "-uno").splitlines()]
    return {"commit": git("rev-parse", "HEAD").strip(), "modified": changed}


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "nice": os.nice(0),
    }


def find_dspark_python(given: str | None) -> str | None:
    candidates = [given] if given else [sys.executable]
    for py in candidates:
        if (
            py
            and subprocess.run([py, "-c", "import mlx_dspark"], capture_output=True).returncode == 0
        ):
            return py
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--servers", default=None, help="rows of the data file (default: its defaults)")
    p.add_argument("--per-kind", type=int, default=None, help="prompts per kind")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model",
        default=None,
        help="the embedded pair whose target every server runs (default: toolflash's default)",
    )
    p.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="ask for complete responses (stream false): end to end only",
    )
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument(
        "--dspark-python",
        default=None,
        help="interpreter with mlx-dspark installed (default: this one; rows that need it are "
        "skipped when it cannot import mlx_dspark)",
    )
    p.add_argument(
        "--toolflash-state",
        default=None,
        help="an already-calibrated toolflash state directory (default: a fresh one, so the "
        "server calibrates as on a first serve)",
    )
    p.add_argument("--blas-threads", default="1", help="OPENBLAS_NUM_THREADS for every server")
    p.add_argument("--start-timeout-s", type=float, default=600)
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--json", dest="json_out", default=str(OUT))
    args = p.parse_args(argv)

    data = json.loads(Path(args.data).read_text())
    wanted = args.servers.split(",") if args.servers else None
    dspark_python = find_dspark_python(args.dspark_python)
    skipped = []
    rows = []
    for row in data["servers"]:
        if (wanted is None and not row.get("default")) or (wanted and row["name"] not in wanted):
            continue
        if row.get("needs") == "dspark" and dspark_python is None:
            skipped.append(f"{row['name']}: mlx-dspark not importable")
            continue
        rows.append(row)
    if not any(r.get("baseline") for r in rows):
        p.error("the baseline row must be among --servers")

    from toolflash.engine.factory import assets_dir
    from toolflash.engine.registry import EMBEDDED_MODEL, EMBEDDED_PAIRS

    model = args.model or EMBEDDED_MODEL
    if model not in EMBEDDED_PAIRS:
        p.error(f"--model: one of {', '.join(EMBEDDED_PAIRS)}")
    target = assets_dir() / EMBEDDED_PAIRS[model][0]
    drafter = assets_dir() / EMBEDDED_PAIRS[model][1]
    env = dict(os.environ)
    if Path(OPENBLAS).exists() and OPENBLAS not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(x for x in (OPENBLAS, env.get("LD_PRELOAD")) if x)
    env["OPENBLAS_NUM_THREADS"] = args.blas_threads
    env.setdefault("PYTHONUNBUFFERED", "1")
    request = dict(data["request"])
    if args.max_tokens is not None:
        request["max_tokens"] = args.max_tokens
    prompts, warmup = load_prompts(data["prompts"], args.per_kind or data["prompts"]["per_kind"])
    info = machine()
    t_start = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="http-peers-") as tmp:
        work = Path(tmp)
        target_f32 = work / "target-f32"
        float32_copy(target, target_f32, env)
        state = Path(args.toolflash_state) if args.toolflash_state else work / "toolflash-state"
        policy_config = work / "policy.yaml"
        policy_config.write_text(f"state_dir: {json.dumps(str(state))}\n")
        values = {
            "{python}": sys.executable,
            "{dspark_python}": dspark_python or "",
            "{target}": str(target),
            "{target_f32}": str(target_f32),
            "{drafter}": str(drafter),
            "{policy_config}": str(policy_config),
            "{toolflash_model}": model,
            "{target_name}": target.name,
        }

        def fill(s: str) -> str:
            for k, v in values.items():
                s = s.replace(k, v)
            return s

        servers = [
            Server(
                name=r["name"],
                label=r["label"],
                argv=[fill(a) for a in r["argv"]],
                model=fill(r["model"]),
                baseline=bool(r.get("baseline")),
                log=work / f"{r['name']}.log",
            )
            for r in rows
        ]
        try:
            with running(servers, env, args.start_timeout_s):
                records = interleaved(
                    servers, prompts, warmup, request, args.repeats, args.seed, args.stream
                )
        except Exception:
            for s in servers:
                print(f"--- {s.name} log tail ---\n{tail(s)}", file=sys.stderr)
            raise
        server_info = [
            {
                "name": s.name,
                "label": s.label,
                "argv": [a.replace(tmp, "$TMP") for a in s.argv],
                "health": {k: v for k, v in s.health.items() if not isinstance(v, dict)},
            }
            for s in servers
        ]

    baseline = next(s.name for s in servers if s.baseline)
    summary = summarize(records, baseline, data["prompts"]["kinds"])
    info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report = {
        "benchmark": "benchmarks/http_peers.py",
        "command": " ".join(["python", "benchmarks/http_peers.py", *argv]),
        "baseline": baseline,
        "model": model,
        "stream": args.stream,
        "servers": server_info,
        "skipped": skipped,
        "request": request,
        "prompts_file": data["prompts"]["file"],
        "prompts": {k: [q.index for q in prompts if q.kind == k] for k in data["prompts"]["kinds"]},
        "warmup_prompts": [q.index for q in warmup],
        "repeats": args.repeats,
        "seed": args.seed,
        "openblas_threads": args.blas_threads,
        "machine": info,
        "versions": versions(dspark_python),
        "tree": tree(),
        "wall_s": round(time.perf_counter() - t_start, 1),
        "rows": summary,
        "requests": [asdict(r) for r in records],
    }
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    for info_row in server_info:
        print(f"{info_row['name']:<14} {info_row['label']}")
    if skipped:
        print("skipped: " + "; ".join(skipped))
    print(format_table(summary))
    print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    sys.exit(main())
