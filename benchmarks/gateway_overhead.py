"""Gateway overhead: the same generations through HTTP and through the engine directly, and
concurrent clients (1/4/16) for throughput and queueing.

    python benchmarks/gateway_overhead.py                     # embedded tiny pair
    python benchmarks/gateway_overhead.py --model M --draft D --json out.json
    python benchmarks/gateway_overhead.py --engine fake       # deterministic test engine
    python benchmarks/gateway_overhead.py --max-tokens 128 --ignore-eos --repeats 2 \
        --clients 0 --mode ar                                 # issue #25's streaming figure

`--ignore-eos` bans the end-of-turn tokens with `logit_bias` (in the direct runs too), so every
run decodes exactly `--max-tokens` tokens (the tiny pair otherwise stops after 10-40); a logit
bias is a processor that follows the output (each queued step's choice waits a step for it).
`--ignore-eos flag` sends the request's `ignore_eos` field instead (the engine's
`GenerationRequest.ignore_eos` in the direct runs): greedy AR then runs its default path, the
next step and its choice queued before a token is read.
`overhead_pct` is what HTTP adds to a generation, relative to the engine alone (the median over
runs of (HTTP - direct) / direct; `best_overhead_pct`: the fastest HTTP run against the fastest
direct one, which other load on a shared machine moves less); `stream_vs_plain_ms_per_token` is
what streaming adds per token over the same request answered in one body.

The direct runs happen inside the engine factory, on the server's engine worker thread, so the
engine is only ever used from one thread (as in serving). Decoding is greedy, so each HTTP run
must produce exactly the tokens of its direct twin; the script checks that.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import sse_socket_client
import uvicorn
from script_env import ensure_optimized_blas_for_script
from starlette.applications import Starlette

from toolflash.engine.api import (
    Engine,
    FinishEvent,
    GenerationRequest,
    Mode,
    SamplingParams,
    TokenEvent,
)
from toolflash.gateway.app import create_app
from toolflash.gateway.config import GatewayConfig

PROMPTS = [
    "Write a Python function that reverses a linked list.",
    "Explain what a context manager is in two sentences.",
    "List five common git commands and what they do.",
    "What does HTTP status 429 mean?",
]


@dataclass
class Run:
    e2e_s: float
    ttft_s: float | None
    completion_tokens: int
    queue_s: float = 0.0
    server_cpu_s: float = 0.0  # CPU time of the server process (all its threads) in the run
    loop_cpu_s: float = 0.0  # ... of its event-loop thread alone (HTTP, SSE, the gateway's work)
    client_cpu_s: float = 0.0  # CPU time of the client process in the run


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def direct_run(
    engine: Engine,
    prompt: str,
    max_tokens: int,
    mode: Mode,
    banned: tuple[int, ...] = (),
    ignore_eos: bool = False,
) -> Run:
    """One generation through the engine API (what the gateway does, minus HTTP)."""
    t0 = time.perf_counter()
    tokens = engine.encode_chat(messages(prompt), None, {"enable_thinking": False})
    request = GenerationRequest(
        prompt_tokens=tuple(tokens),
        max_tokens=max_tokens,
        mode=mode,
        sampling=SamplingParams(logit_bias=dict.fromkeys(banned, -100.0)),
        ignore_eos=ignore_eos,
    )
    ttft = None
    n = 0
    for ev in engine.generate(request):
        if isinstance(ev, TokenEvent) and ev.token_ids and ttft is None:
            ttft = time.perf_counter() - t0
        if isinstance(ev, FinishEvent):
            n = ev.stats.completion_tokens
    return Run(time.perf_counter() - t0, ttft, n)


def request_body(
    prompt: str, max_tokens: int, stream: bool, banned: tuple[int, ...], ignore_eos: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": messages(prompt),
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": False},
        "stream": stream,
    }
    if banned:
        body["logit_bias"] = {str(t): -100 for t in banned}
    if ignore_eos:
        body["ignore_eos"] = True
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def http_run(
    client: httpx.Client,
    url: str,
    prompt: str,
    max_tokens: int,
    stream: bool,
    banned: tuple[int, ...] = (),
    ignore_eos: bool = False,
) -> Run:
    body = request_body(prompt, max_tokens, stream, banned, ignore_eos)
    t0 = time.perf_counter()
    if not stream:
        r = client.post(f"{url}/v1/chat/completions", json=body)
        r.raise_for_status()
        data = r.json()
        e2e = time.perf_counter() - t0
        tf = data["toolflash"]["timings"]
        return Run(e2e, None, data["usage"]["completion_tokens"], tf["queue_s"])
    ttft = None
    usage: dict[str, Any] = {}
    queue_s = 0.0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            choices = chunk.get("choices") or []
            if (
                ttft is None
                and choices
                and (
                    choices[0]["delta"].get("content")
                    or choices[0]["delta"].get("reasoning_content")
                )
            ):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
                queue_s = chunk["toolflash"]["timings"]["queue_s"]
    return Run(time.perf_counter() - t0, ttft, usage.get("completion_tokens", 0), queue_s)


# uvicorn's loop and HTTP protocol per --http-stack: "auto" takes uvloop and httptools (the
# dependencies `toolflash serve` runs on), "plain" asyncio's loop and h11 (as before them),
# "asyncio_httptools" asyncio's loop with httptools (its socket writes release the GIL).
HTTP_STACKS = {
    "auto": ("auto", "auto"),
    "plain": ("asyncio", "h11"),
    "asyncio_httptools": ("asyncio", "httptools"),
}


def start_server(
    app: Starlette, stack: str = "auto"
) -> tuple[str, uvicorn.Server, threading.Thread]:
    # proto=IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets of that proto
    # (with proto 0 every response body waits ~40 ms for a delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    loop, http = HTTP_STACKS[stack]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, loop=loop, http=http)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return
            if r.json().get("status") == "failed":
                raise RuntimeError(f"engine failed to load: {r.json().get('error')}")
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the engine did not become ready")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def overhead(direct: list[Run], http: list[Run]) -> dict[str, float]:
    added = [h.e2e_s - d.e2e_s for d, h in zip(direct, http, strict=True)]
    per_tok = [a / max(h.completion_tokens, 1) for a, h in zip(added, http, strict=True)]
    return {
        "direct_e2e_ms": round(1e3 * median([d.e2e_s for d in direct]), 3),
        "http_e2e_ms": round(1e3 * median([h.e2e_s for h in http]), 3),
        "direct_ms_per_token": round(
            1e3 * median([d.e2e_s / max(d.completion_tokens, 1) for d in direct]), 4
        ),
        "added_ms_per_request": round(1e3 * median(added), 3),
        "added_ms_per_token": round(1e3 * median(per_tok), 4),
        "overhead_pct": round(
            100 * median([a / d.e2e_s for a, d in zip(added, direct, strict=True)]), 2
        ),
        # Fastest run against fastest run: what is left when other load on the machine
        # slowed some runs of either kind (the medians move with it).
        "best_overhead_pct": round(
            100 * (min(h.e2e_s for h in http) / min(d.e2e_s for d in direct) - 1), 2
        ),
        # CPU time: the server process's, and what HTTP adds to it (median over runs, relative
        # to the direct run's); the client process's beside it.
        "direct_server_cpu_ms": round(1e3 * median([d.server_cpu_s for d in direct]), 3),
        "http_server_cpu_ms": round(1e3 * median([h.server_cpu_s for h in http]), 3),
        "added_server_cpu_pct": round(
            100
            * median(
                [(h.server_cpu_s - d.server_cpu_s) / d.server_cpu_s for d, h in zip(direct, http)]
            ),
            2,
        ),
        "loop_cpu_ms": round(1e3 * median([h.loop_cpu_s for h in http]), 3),
        "client_cpu_ms": round(1e3 * median([h.client_cpu_s for h in http]), 3),
    }


def stream_vs_plain(plain: list[Run], streamed: list[Run]) -> float:
    """Median ms per token that streaming adds over the same request answered in one body."""
    return round(
        1e3
        * median(
            [
                (s.e2e_s - p.e2e_s) / max(s.completion_tokens, 1)
                for p, s in zip(plain, streamed, strict=True)
            ]
        ),
        4,
    )


def concurrency(
    url: str, prompts: list[str], clients: int, per_client: int, max_tokens: int
) -> dict[str, Any]:
    runs: list[Run] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        with httpx.Client(timeout=600) as c:
            for k in range(per_client):
                try:
                    run = http_run(c, url, prompts[(i + k) % len(prompts)], max_tokens, stream=True)
                except Exception as exc:  # report, do not hide: 429s show up here
                    with lock:
                        errors.append(repr(exc))
                    continue
                with lock:
                    runs.append(run)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r.completion_tokens for r in runs)
    return {
        "clients": clients,
        "requests": len(runs),
        "errors": errors[:5],
        "wall_s": round(wall, 3),
        "throughput_tok_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "requests_per_s": round(len(runs) / wall, 3) if wall > 0 else 0.0,
        "median_queue_ms": round(1e3 * median([r.queue_s for r in runs]), 2),
        "max_queue_ms": round(1e3 * max((r.queue_s for r in runs), default=0.0), 2),
        "median_ttft_ms": round(1e3 * median([r.ttft_s for r in runs if r.ttft_s is not None]), 2),
        "median_e2e_ms": round(1e3 * median([r.e2e_s for r in runs]), 2),
    }


def http_once(
    url: str,
    prompt: str,
    max_tokens: int,
    stream: bool,
    banned: tuple[int, ...] = (),
    ignore_eos: bool = False,
    client: str = "httpx",
) -> Run:
    """One HTTP generation from a fresh client (runs in the client process)."""
    if client == "socket":
        c0 = time.process_time()
        body = request_body(prompt, max_tokens, stream, banned, ignore_eos)
        e2e, ttft, data = sse_socket_client.post(f"{url}/v1/chat/completions", body, stream)
        timings = data["toolflash"]["timings"]
        run = Run(e2e, ttft, data["usage"]["completion_tokens"], timings["queue_s"])
        run.client_cpu_s = time.process_time() - c0
        return run
    with httpx.Client(timeout=600) as c:
        c0 = time.process_time()
        run = http_run(c, url, prompt, max_tokens, stream, banned, ignore_eos)
        run.client_cpu_s = time.process_time() - c0
        return run


def measured(start: Callable[[], Future[Run]], loop_thread: threading.Thread) -> Run:
    """The run `start()` starts, with the CPU time this (the server's) process and its
    event-loop thread spent until it ended: CPU time moves far less than wall time with other
    load on the machine."""
    loop_clock = time.pthread_getcpuclockid(loop_thread.ident or 0)
    c0, l0 = time.process_time(), time.clock_gettime(loop_clock)
    run = start().result()
    run.server_cpu_s = time.process_time() - c0
    run.loop_cpu_s = time.clock_gettime(loop_clock) - l0
    return run


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("toolflash", "mlx", "mlx-lm", "starlette", "uvicorn", "httpx"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def effective_loop_nice(config: GatewayConfig) -> int:
    """The nice steps the server's loop ran with (the setting itself in a tree from before
    `loop_nice_for`, as `gateway_overhead_rounds.py` runs older commits)."""
    try:
        from toolflash.gateway.thread_priority import loop_nice_for, mlx_on_cpu, usable_cores
    except ImportError:
        return int(config.loop_nice or 0)
    return loop_nice_for(config.loop_nice, mlx_on_cpu(), usable_cores())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None)
    p.add_argument("--draft", default=None)
    p.add_argument("--engine", choices=("real", "fake"), default="real")
    p.add_argument("--fake-cycle-ms", type=float, default=2.0, help="fake engine: delay per cycle")
    p.add_argument("--mode", choices=("spec", "ar"), default="spec")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="runs of each prompt per variant")
    p.add_argument(
        "--ignore-eos",
        nargs="?",
        const="bias",
        choices=("bias", "flag"),
        default=None,
        help="decode --max-tokens every run: bias (alone too) bans the end-of-turn tokens with"
        " logit_bias -100; flag sends the request's ignore_eos field",
    )
    p.add_argument(
        "--client",
        choices=("httpx", "socket"),
        default="httpx",
        help="the measured runs' client: httpx (iter_lines, json.loads per chunk) or socket"
        " (sse_socket_client.py: one recv per chunk, parsed once at the end; less CPU taken"
        " from the server's cores)",
    )
    p.add_argument("--clients", default="1,4,16", help="concurrent clients per run; 0: none")
    p.add_argument(
        "--stream-interval-ms",
        type=float,
        default=None,
        help="the gateway's stream_interval_ms (default: the server's default)",
    )
    p.add_argument(
        "--loop-nice",
        type=int,
        default=None,
        help="the gateway's loop_nice: the event loop thread this many nice steps lower"
        " (default: the server's default)",
    )
    p.add_argument("--per-client", type=int, default=2)
    p.add_argument(
        "--http-stack",
        choices=tuple(HTTP_STACKS),
        default="auto",
        help="auto: uvicorn's choice (uvloop and httptools when installed, as serve runs);"
        " plain: asyncio's loop and h11; asyncio_httptools: asyncio's loop and httptools",
    )
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="sys.setswitchinterval for the server process (default: Python's 5 ms)",
    )
    p.add_argument("--json", dest="json_out", default=None)
    args = p.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)

    prompts = PROMPTS
    if args.engine == "fake":  # the fake engine says what follows SCRIPT: (one token a char)
        text = "lorem ipsum dolor sit amet " * (1 + args.max_tokens // 27)
        prompts = [f"SCRIPT:{i} {text}"[: 7 + args.max_tokens] for i in range(len(PROMPTS))]
    work = [pr for pr in prompts for _ in range(args.repeats)]

    def factory() -> Engine:
        if args.engine == "fake":
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.gateway.fake_engine import FakeEngine

            return FakeEngine(cycle_delay_s=args.fake_cycle_ms / 1e3)
        from toolflash.engine.factory import build_engine

        return build_engine(args.model, args.draft, mode=args.mode, block_size=args.block_size)

    config = GatewayConfig(mode=args.mode, block_size=args.block_size, max_queue=64)
    if args.stream_interval_ms is not None:
        config = config.model_copy(update={"stream_interval_ms": args.stream_interval_ms})
    if args.loop_nice is not None:
        config = config.model_copy(update={"loop_nice": args.loop_nice})
    app = create_app(factory, config)
    url, server, thread = start_server(app, args.http_stack)
    direct: list[Run] = []
    plain: list[Run] = []
    streamed: list[Run] = []
    try:
        wait_ready(url, timeout=1800)
        stack_loop = type(server.servers[0].get_loop()).__module__  # uvloop or asyncio.*
        worker = app.state.gateway.worker
        # Clients run in their own process, as real clients do (here they would compete with
        # the engine and the event loop for the GIL). Direct runs go through the worker so the
        # engine stays on its one thread; the three variants of each prompt run back to back
        # so machine-load drift hits them alike.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            banned: tuple[int, ...] = ()
            flag = args.ignore_eos == "flag"
            if args.ignore_eos == "bias":
                banned = worker.call(lambda e: tuple(sorted(getattr(e, "eos_ids", ())))).result()
            worker.call(lambda e: direct_run(e, prompts[0], 4, args.mode)).result()  # warm-up
            pool.submit(http_once, url, prompts[0], 4, False).result()
            for prompt in work:
                job = partial(
                    direct_run,
                    prompt=prompt,
                    max_tokens=args.max_tokens,
                    mode=args.mode,
                    banned=banned,
                    ignore_eos=flag,
                )
                direct.append(measured(partial(worker.call, job), thread))
                for stream, runs in ((False, plain), (True, streamed)):
                    runs.append(
                        measured(
                            partial(
                                pool.submit,
                                http_once,
                                url,
                                prompt,
                                args.max_tokens,
                                stream,
                                banned,
                                flag,
                                args.client,
                            ),
                            thread,
                        )
                    )
            clients = [int(n) for n in args.clients.split(",") if int(n) > 0]
            conc = [
                pool.submit(concurrency, url, prompts, n, args.per_client, args.max_tokens).result()
                for n in clients
            ]
    finally:
        server.should_exit = True
        thread.join(30)
    mismatch = [
        (d.completion_tokens, h.completion_tokens, s.completion_tokens)
        for d, h, s in zip(direct, plain, streamed, strict=True)
        if not d.completion_tokens == h.completion_tokens == s.completion_tokens
    ]

    report = {
        "benchmark": "gateway_overhead",
        "engine": args.engine,
        "model": args.model or ("fake" if args.engine == "fake" else "embedded tiny pair"),
        "draft": args.draft,
        "mode": args.mode,
        "max_tokens": args.max_tokens,
        "ignore_eos": args.ignore_eos,
        "client": args.client,
        "command": "python benchmarks/gateway_overhead.py " + " ".join(argv or sys.argv[1:]),
        "runs_per_variant": len(work),
        "median_completion_tokens": median([float(d.completion_tokens) for d in direct]),
        "token_mismatches": mismatch,
        "non_streaming": overhead(direct, plain),
        "streaming": {
            **overhead(direct, streamed),
            "direct_ttft_ms": round(1e3 * median([d.ttft_s for d in direct if d.ttft_s]), 3),
            "http_ttft_ms": round(1e3 * median([s.ttft_s for s in streamed if s.ttft_s]), 3),
            "stream_vs_plain_ms_per_token": stream_vs_plain(plain, streamed),
        },
        "concurrency": conc,
        "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "switch_interval_ms": sys.getswitchinterval() * 1e3,
        "stream_interval_ms": getattr(config, "stream_interval_ms", None),
        "loop_nice": effective_loop_nice(config),
        "http_stack": {
            "requested": args.http_stack,
            "loop": stack_loop,
            "protocol": server.config.http_protocol_class.__name__,
        },
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "versions": versions(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 1 if mismatch else 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    sys.exit(main())
