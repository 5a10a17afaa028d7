"""Concurrent streaming clients against one `toolflash serve` (continuous batching, issue 31).

    python benchmarks/concurrent_clients.py                  # embedded qwen35 pair, 1/4/8 clients
    python benchmarks/concurrent_clients.py --clients 1,2,4,8 --prompts 16 --repeats 2 \
        --json benchmarks/results/concurrent_clients.json

Throughput: the same pool of chat requests (the embedded benchmark prompts, every kind, greedy,
`--max-tokens`, natural end of turn) is sent by N streaming clients that each take the next
prompt when their last one ends; aggregate decode throughput = completion tokens / wall time
of the whole pool, so every N does the same work (when outputs are equal) and the ratio to one
client is wall(1) / wall(N). Configurations are interleaved per repeat.

Lossless: each prompt's text at N clients against its text at one client (greedy: they should
be equal; a difference means batched float reductions flipped a near-tie).

OpenCode pattern: a short title request and a long main request (tools, a ~`--main-chars`
system prompt with a fresh nonce per run so the prefix cache never serves it) sent at the same
time; the main request's TTFT against its TTFT alone, interleaved per repeat.

Peak memory: the server's resident set, sampled every 20 ms, per configuration.

Two servers run side by side, interleaved: "batched" (the default continuous batch) and
"serial" (`--max-batch 1`: one request at a time, the engine's own loop, as before batching),
so the single-client figures compare the batch scheduler's solo path with the engine's loop.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from script_env import ensure_optimized_blas_for_script

from toolflash.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "toolflash" / "assets" / "tiny" / "bench_prompts.jsonl"


@dataclass
class Result:
    text: str
    tokens: int
    ttft_s: float
    e2e_s: float


def stream(client: httpx.Client, url: str, body: dict[str, Any]) -> Result:
    """One streamed chat completion: its text, completion tokens, TTFT and end-to-end time."""
    t0 = time.perf_counter()
    ttft = None
    text = ""
    tokens = 0
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                piece += json.dumps(delta["tool_calls"]) if delta.get("tool_calls") else ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    e2e = time.perf_counter() - t0
    return Result(text, tokens, ttft if ttft is not None else e2e, e2e)


def pool(url: str, bodies: list[dict[str, Any]], clients: int) -> tuple[float, list[Result]]:
    """Send `bodies` through `clients` concurrent streaming clients; wall time and results."""
    results: list[Result | None] = [None] * len(bodies)
    next_index = iter(range(len(bodies)))
    lock = threading.Lock()

    def client_loop() -> None:
        with httpx.Client(timeout=600) as c:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                results[i] = stream(c, url, bodies[i])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if any(r is None for r in results):
        raise RuntimeError("a request failed (see the server log)")
    return wall, [r for r in results if r is not None]


class RssSampler:
    """Peak resident set of a process, sampled every 20 ms while active."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    @contextmanager
    def sampling(self) -> Iterator[None]:
        self.peak = self._rss()
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(0.02):
                self.peak = max(self.peak, self._rss())

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()


@contextmanager
def server(model: str, extra: list[str], log_path: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    cmd = ["toolflash", "serve", "--port", str(port), "--model", model]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd + extra, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited; see {log_path}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            else:
                raise RuntimeError(f"server not ready; see {log_path}")
            yield url, proc.pid
        finally:
            proc.terminate()
            proc.wait(30)


def chat_bodies(model: str, n: int, max_tokens: int) -> list[dict[str, Any]]:
    """`n` benchmark prompts, the kinds interleaved."""
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row)
    kinds = sorted(by_kind)
    picked = [by_kind[kinds[i % len(kinds)]][i // len(kinds)] for i in range(n)]
    bodies = []
    for row in picked:
        body = {"model": model, "messages": row["messages"], "max_tokens": max_tokens}
        for key in ("tools", "chat_template_kwargs", "response_format"):
            if key in row:
                body[key] = row[key]
        bodies.append(body)
    return bodies


def opencode_bodies(model: str, main_chars: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A title request and a main request with tools and a long system prompt (a fresh nonce
    first, so no earlier run's prefix is reused)."""
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    tool_row = next(r for r in rows if r["kind"] == "tool_call")
    source = (ROOT / "engine" / "session.py").read_text()
    context = (source * (main_chars // len(source) + 1))[:main_chars]
    nonce = uuid.uuid4().hex
    system = f"Session {nonce}. You are a coding agent. Repository excerpt:\n{context}"
    user = "Fix the bug in the prefill loop and explain the change."
    main = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "tools": tool_row["tools"],
        "tool_choice": "auto",
        "max_tokens": 64,
    }
    title = {
        "model": model,
        "messages": [
            {"role": "system", "content": f"Title {nonce}: write a short title."},
            {"role": "user", "content": user},
        ],
        "max_tokens": 24,
    }
    return title, main


def opencode_run(url: str, model: str, main_chars: int, with_title: bool) -> float:
    """The main request's TTFT, alone or sent together with a title request."""
    title, main = opencode_bodies(model, main_chars)
    results: dict[str, Result] = {}

    def send(name: str, body: dict[str, Any]) -> None:
        with httpx.Client(timeout=600) as c:
            results[name] = stream(c, url, body)

    threads = [threading.Thread(target=send, args=("main", main))]
    if with_title:
        threads.insert(0, threading.Thread(target=send, args=("title", title)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results["main"].ttft_s


def measure(
    url: str, pid: int, bodies: list[dict[str, Any]], n: int
) -> tuple[float, list[Result], int]:
    rss = RssSampler(pid)
    with rss.sampling():
        wall, results = pool(url, bodies, n)
    return wall, results, rss.peak


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="toolflash-tiny-qwen35")
    p.add_argument("--clients", default="1,4,8")
    p.add_argument("--prompts", type=int, default=16, help="requests in the pool per run")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--opencode-repeats", type=int, default=3)
    p.add_argument("--main-chars", type=int, default=12000)
    p.add_argument("--serve-args", default="", help="extra `toolflash serve` arguments")
    p.add_argument(
        "--serial-args",
        default="--max-batch 1",
        help="the second server, run side by side ('' to skip): one request at a time",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]
    bodies = chat_bodies(args.model, args.prompts, args.max_tokens)
    configs = {"batched": args.serve_args}
    if args.serial_args:
        configs["serial"] = args.serial_args
    walls: dict[tuple[str, int], list[float]] = {}
    peaks: dict[tuple[str, int], int] = {}
    texts: dict[tuple[str, int], list[str]] = {}
    tokens: dict[tuple[str, int], int] = {}
    ttfts: dict[tuple[str, int], list[float]] = {}
    opencode: dict[str, list[float]] = {"alone": [], "with_title": []}
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(
                server(args.model, extra.split(), ROOT / ".work" / f"concurrent_{name}.log")
            )
            for name, extra in configs.items()
        }
        for url, _ in servers.values():
            pool(url, bodies[:2], 2)  # warm-up: first-request costs out of the figures
        for rep in range(args.repeats):
            order = [(name, n) for n in counts for name in configs]
            for name, n in order if rep % 2 == 0 else list(reversed(order)):
                url, pid = servers[name]
                wall, results, peak = measure(url, pid, bodies, n)
                key = (name, n)
                walls.setdefault(key, []).append(wall)
                peaks[key] = max(peaks.get(key, 0), peak)
                texts.setdefault(key, [r.text for r in results])
                tokens[key] = sum(r.tokens for r in results)
                ttfts.setdefault(key, []).extend(r.ttft_s for r in results)
                print(f"rep {rep} {name} clients {n}: {wall:.2f} s, {tokens[key] / wall:.1f} tok/s")
        url = servers["batched"][0]
        for rep in range(args.opencode_repeats):
            for mode in ("alone", "with_title") if rep % 2 == 0 else ("with_title", "alone"):
                ttft = opencode_run(url, args.model, args.main_chars, mode != "alone")
                opencode[mode].append(ttft)
    one = ("batched", counts[0])
    med = {k: statistics.median(w) for k, w in walls.items()}
    rows = []
    for name, n in sorted(walls):
        key = (name, n)
        rows.append(
            {
                "server": name,
                "clients": n,
                "wall_s": [round(w, 3) for w in walls[key]],
                "aggregate_tok_s": round(tokens[key] / med[key], 1),
                "ratio_to_one_client": round(med[one] / med[key], 2),
                "median_ttft_ms": round(1e3 * statistics.median(ttfts[key]), 1),
                "outputs_differing_from_one_client": sum(
                    a != b for a, b in zip(texts[key], texts[one])
                ),
                "completion_tokens": tokens[key],
                "peak_rss_mb": round(peaks[key] / 2**20, 1),
            }
        )
    alone = statistics.median(opencode["alone"])
    together = statistics.median(opencode["with_title"])
    report = {
        "command": "python benchmarks/concurrent_clients.py " + " ".join(argv or sys.argv[1:]),
        "model": args.model,
        "servers": configs,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "throughput": rows,
        "opencode": {
            "main_ttft_alone_ms": [round(1e3 * t, 1) for t in opencode["alone"]],
            "main_ttft_with_title_ms": [round(1e3 * t, 1) for t in opencode["with_title"]],
            "ratio": round(together / alone, 3),
        },
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    }
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
