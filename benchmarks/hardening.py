"""Issue #26's figures on the embedded model: hostile requests against `toolflash serve`, and a
damaged disk cache at start-up. Writes `benchmarks/results/hardening.json` ("hostile",
"damaged_cache"; the fuzz counts come from `TOOLFLASH_FUZZ_LONG=1` tests/gateway/test_fuzz.py).

    python benchmarks/hardening.py [--part hostile|cache|all]

hostile: a server process (`toolflash serve --policy off`), a client that sends a normal chat
request every 50 ms throughout, and per hostile request: its status and time to answer, the
server's RSS growth (sampled every 10 ms from /proc), and the normal requests' median latency
while it is in flight against the median without it.

cache: 50 agent prompts run on a server without cache (the cold outputs), then on one with a
disk cache (100 L2 files), every file damaged (20 kinds, 5 files each), then `toolflash serve`
started on that directory (it must come up) and the prompts run again (outputs must equal the
cold ones); finally every file is looked up: each is quarantined or validated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from script_env import ensure_optimized_blas_for_script

from toolflash.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "hardening.json"
NORMAL = {
    "messages": [{"role": "user", "content": "def add(a, b):"}],
    "max_tokens": 8,
    "chat_template_kwargs": {"enable_thinking": False},
}
LOOPING = "{% for i in range(10**9) %}{{ i }}{% endfor %}"


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@contextmanager
def served(*extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`toolflash serve` on a free port, until /health answers 200."""
    port = free_port()
    cmd = [sys.executable, "-m", "toolflash.cli", "serve", "--port", str(port), "--policy", "off"]
    proc = subprocess.Popen(
        [*cmd, "--log-level", "warning", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
                raise RuntimeError(f"toolflash serve exited with {proc.returncode}: {err}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("toolflash serve did not become ready")
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(30)


# ---------------------------------------------------------------- hostile requests


def _huge_body(chars: int) -> Iterator[bytes]:
    """A chat body with a `chars`-character template argument, streamed in 1 MB pieces (no
    Content-Length: the server must stop reading at its limit)."""
    yield b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": '
    yield b'{"reasoning_effort": "'
    piece = b"x" * (1 << 20)
    for _ in range(chars >> 20):
        yield piece
    yield b'"}}'


def _hostile(url: str) -> dict[str, Callable[[httpx.Client], httpx.Response]]:
    chat = f"{url}/v1/chat/completions"
    body_15mb = json.dumps({**NORMAL, "messages": [{"role": "user", "content": "x" * 15_000_000}]})
    return {
        "looping_template_kwarg": lambda c: c.post(
            chat, json={**NORMAL, "chat_template_kwargs": {"chat_template": LOOPING}}
        ),
        "looping_template_field": lambda c: c.post(chat, json={**NORMAL, "chat_template": LOOPING}),
        "body_15mb": lambda c: c.post(
            chat, content=body_15mb, headers={"content-type": "application/json"}
        ),
        "argument_100m_chars_chunked": lambda c: c.post(
            chat, content=_huge_body(100_000_000), headers={"content-type": "application/json"}
        ),
        "prompt_3mb_beyond_context": lambda c: c.post(
            chat, json={**NORMAL, "messages": [{"role": "user", "content": "word " * 700_000}]}
        ),
        "deep_json_100k": lambda c: c.post(
            chat,
            content='{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}",
            headers={"content-type": "application/json"},
        ),
        "token_ids_past_vocab": lambda c: c.post(
            f"{url}/v1/completions", json={"prompt": [4105, 100000, 999999999], "max_tokens": 4}
        ),
        "max_tokens_1e9": lambda c: c.post(chat, json={**NORMAL, "max_tokens": 10**9}),
    }


class Normal:
    """A client sending the normal request every 50 ms, recording (start, latency)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                r = c.post(f"{self.url}/v1/chat/completions", json=NORMAL)
                assert r.status_code == 200, r.text
                self.samples.append((t0, time.perf_counter() - t0))
                time.sleep(0.05)

    def __enter__(self) -> Normal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def median_between(self, a: float, b: float) -> float | None:
        xs = [lat for t0, lat in self.samples if a <= t0 <= b or a <= t0 + lat <= b]
        return statistics.median(xs) if xs else None


def hostile() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with served() as (url, proc), httpx.Client(timeout=300) as client:
        for _ in range(5):  # warm-up
            client.post(f"{url}/v1/chat/completions", json=NORMAL)
        with Normal(url) as normal:
            time.sleep(3)
            t_base = time.perf_counter()
            time.sleep(3)
            baseline = normal.median_between(t_base - 3, t_base + 3)
            for name, send in _hostile(url).items():
                time.sleep(1.0)
                rss0 = _rss(proc.pid)
                peak = [rss0]
                done = threading.Event()

                def sample(peak: list[int] = peak, done: threading.Event = done) -> None:
                    while not done.is_set():
                        peak[0] = max(peak[0], _rss(proc.pid))
                        time.sleep(0.01)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                t0 = time.perf_counter()
                try:
                    r = send(client)
                    status, code = r.status_code, r.json()["error"]["code"]
                except httpx.HTTPError as exc:  # the server answered and closed mid-upload
                    status, code = -1, f"client: {type(exc).__name__}"
                answered = time.perf_counter() - t0
                # Keep the window at least 1 s so the concurrent client has requests in it.
                time.sleep(max(0.0, 1.0 - answered))
                t1 = time.perf_counter()
                done.set()
                sampler.join()
                during = normal.median_between(t0, t1)
                out[name] = {
                    "status": status,
                    "code": code,
                    "answered_s": round(answered, 3),
                    "rss_growth_mb": round((peak[0] - rss0) / 2**20, 1),
                    "normal_median_ms": round(during * 1e3, 1) if during else None,
                    "normal_latency_growth_ms": round((during - baseline) * 1e3, 1)
                    if during and baseline
                    else None,
                }
                print(name, out[name], flush=True)
        out["normal_baseline_median_ms"] = round(baseline * 1e3, 1) if baseline else None
        assert proc.poll() is None, "the server died"
    return out


# ---------------------------------------------------------------- damaged cache


PROMPTS = [
    [
        {"role": "system", "content": "You are a coding agent. Answer briefly."},
        {"role": "user", "content": f"Task {i}: write a Python function number {i} that " + w},
    ]
    for i, w in enumerate(
        ["adds two numbers.", "reverses a string.", "parses a CSV line.", "sums a list."] * 15
    )
]
# 20 kinds of damage, 5 files each (the unit tests apply one more kind).
KINDS = 20


def _outputs(url: str, gap_s: float = 0.0) -> list[str]:
    """Each prompt's answer; `gap_s` between requests lets the disk writer, which waits for a
    quiet engine and queues at most 64 snapshots, write them all."""
    out = []
    with httpx.Client(timeout=120) as c:
        for messages in PROMPTS:
            body = {
                "messages": messages,
                "max_tokens": 12,
                "chat_template_kwargs": NORMAL["chat_template_kwargs"],
            }
            r = c.post(f"{url}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            out.append(r.json()["choices"][0]["message"]["content"])
            time.sleep(gap_s)
    return out


def _settle(directory: Path, quiet_s: float = 5.0, limit_s: float = 120.0) -> None:
    """Wait until no L2 file has appeared for `quiet_s` (queued writes are done)."""
    deadline = time.monotonic() + limit_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = len(list(directory.glob("*.json")))
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.5)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"toolflash:prefix_cache_{name} "):
            return float(line.split()[-1])
    return 0.0


def damaged_cache() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.cache.test_l2_quarantine import DAMAGE
    from toolflash.cache.l2 import DiskCache

    work = Path(tempfile.mkdtemp(prefix="toolflash-hardening-"))
    cache_dir = work / "l2"
    try:
        with served("--no-cache") as (url, _):
            cold = _outputs(url)
        with served("--cache-dir", str(cache_dir)) as (url, _):
            warm = _outputs(url, gap_s=0.8)
            _settle(cache_dir)  # the writer waits for a quiet engine
        metas = sorted(cache_dir.glob("*.json"))
        assert len(metas) >= 100, f"only {len(metas)} L2 files written"
        tokens = {m.stem: tuple(json.loads(m.read_text())["tokens"]) for m in metas}
        kinds = sorted(k for k in DAMAGE if k != "deep_nesting_in_key")[:KINDS]
        damaged = {}
        for i, meta in enumerate(metas[:100]):
            damaged[meta.stem] = kinds[i % len(kinds)]
            DAMAGE[damaged[meta.stem]](meta, meta.with_suffix(".safetensors"))
        t0 = time.perf_counter()
        with served("--cache-dir", str(cache_dir)) as (url, proc):
            started_s = time.perf_counter() - t0
            after = _outputs(url)
            by_server = _metric(httpx.get(f"{url}/metrics").text, "l2_quarantined")
            time.sleep(10)  # idle: the disk writer checksums what no lookup read
            metrics = httpx.get(f"{url}/metrics").text
            by_server_idle = _metric(metrics, "l2_quarantined")
            verified = _metric(metrics, "l2_verified")
            alive = proc.poll() is None
        # Then every file is looked up once (what no request needed was never read).
        from toolflash.engine.factory import build_engine

        key = build_engine(cache=None).cache_key
        disk = DiskCache(cache_dir)
        for t in tokens.values():
            disk.lookup(key, t)
        disk.close()
        moved = {p.name.split(".")[0] for p in (cache_dir / "quarantine").iterdir()}
        return {
            "l2_files": len(metas),
            "damaged": len(damaged),
            "damage_kinds": len(set(damaged.values())),
            "per_kind": {k: list(damaged.values()).count(k) for k in kinds},
            "startup_ok": alive,
            "startup_s": round(started_s, 1),
            # Start-up checks every metadata file; data (checksum) is checked when a lookup
            # reads it, or by the disk writer while the engine is idle.
            "quarantined_by_server": by_server,
            "quarantined_by_server_after_10s_idle": by_server_idle,
            "verified_by_server_after_10s_idle": verified,
            "quarantined_in_all": len(moved & set(damaged)),
            "damaged_not_quarantined": len(set(damaged) - moved),
            "intact_files_quarantined": len(moved - set(damaged)),
            "outputs_identical_to_cold": after == cold,
            "warm_outputs_identical_to_cold": warm == cold,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("hostile", "cache", "all"), default="all")
    args = p.parse_args()
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    if args.part in ("hostile", "all"):
        data["hostile"] = {
            "command": "python benchmarks/hardening.py --part hostile",
            "machine": machine,
            **hostile(),
        }
    if args.part in ("cache", "all"):
        data["damaged_cache"] = {
            "command": "python benchmarks/hardening.py --part cache",
            "machine": machine,
            **damaged_cache(),
        }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
