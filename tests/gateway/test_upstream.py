"""Upstream pools against real servers on loopback: two `toolflash serve` processes (the embedded
model), mlx-lm's server, and a server that answers /health but never answers a completion; the
gateway itself is a `toolflash serve --no-local-model --upstreams FILE` process. Every process is
started here and stopped by its PID."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolflash.gateway.upstream_config import UpstreamPool
from toolflash.gateway.upstream_pool import Replica, failed, pick
from toolflash.gateway.upstream_wire import ChunkText
from toolflash.ports import free_port

TINY = Path(__file__).resolve().parents[2] / "toolflash/assets/tiny/qwen35-tiny"
UPSTREAM_MODEL = "toolflash-tiny-qwen35"
NO_EOS = {"2": -100}  # the tiny model's EOS id: a stream that runs to max_tokens
HANG = textwrap.dedent(
    """
    import asyncio, sys
    async def serve(reader, writer):
        head = await reader.readuntil(b"\\r\\n\\r\\n")
        if head.startswith(b"GET"):
            writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\n{}")
            await writer.drain(); writer.close(); return
        if sys.argv[2] == "stall":  # headers and one chunk, then silence
            writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\n\\r\\n")
            writer.write(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\\n\\n')
            await writer.drain()
        await asyncio.sleep(3600)  # a wedged engine: the completion never starts (or goes on)
    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
        await server.serve_forever()
    asyncio.run(main())
    """
)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{url} exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} never became healthy")


def metric(gateway: str, name: str, upstream: str) -> float:
    """A per-replica gauge of the gateway's /metrics."""
    for line in httpx.get(f"{gateway}/metrics").text.splitlines():
        if line.startswith(f"toolflash:upstream_{name}{{") and f'upstream="{upstream}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name, upstream)


class Servers:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}

    def start(self, name: str, argv: list[str], port: int) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - the process owns it
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.urls[name] = f"http://127.0.0.1:{port}"

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill(name)


def has_mlx_server() -> bool:
    try:
        import mlx_lm.server  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    tmp = tmp_path_factory.mktemp("upstreams")
    s = Servers(tmp)
    try:
        for name in ("up1", "up2"):
            port = free_port()
            s.start(
                name,
                ["toolflash", "serve", "--port", str(port), "--policy", "off", "--no-calibrate"]
                + ["--state-dir", str(tmp / name), "--log-level", "warning"],
                port,
            )
        for name in ("hang", "stall"):
            port = free_port()
            s.start(name, [sys.executable, "-c", HANG, str(port), name], port)
        pools: list[dict[str, Any]] = [
            {
                "model": "pool",
                "upstream_model": UPSTREAM_MODEL,
                "urls": [f"{s.urls['up1']}/v1", f"{s.urls['up2']}/v1"],
                "failures_to_open": 1,
                "cooldown_s": 60,
                "health_interval_s": 0.5,
            },
            {"model": "hang", "urls": [f"{s.urls['hang']}/v1"], "first_byte_timeout_s": 1.5},
            {"model": "stall", "urls": [f"{s.urls['stall']}/v1"], "idle_timeout_s": 1.0},
            {
                "model": "mixed",
                "upstream_model": UPSTREAM_MODEL,
                "urls": [f"{s.urls['hang']}/v1", f"{s.urls['up1']}/v1"],
                "first_byte_timeout_s": 1.5,
            },
        ]
        if has_mlx_server():
            port = free_port()
            s.start(
                "mlx",
                [sys.executable, "-m", "mlx_lm", "server", "--model", str(TINY)]
                + ["--port", str(port)],
                port,
            )
            pools.append(
                {"model": "mlx", "upstream_model": "default_model", "urls": [f"{s.urls['mlx']}/v1"]}
            )
        (tmp / "upstreams.yaml").write_text(json.dumps({"pools": pools}))  # JSON is YAML
        port = free_port()
        s.start(
            "gateway",
            ["toolflash", "serve", "--no-local-model", "--upstreams", str(tmp / "upstreams.yaml")]
            + ["--port", str(port), "--stream-interval-ms", "0"],
            port,
        )
        for name in s.procs:
            wait_healthy(s.urls[name], s.procs[name])
        yield s
    finally:
        s.stop_all()


def chat(gateway: str, model: str, **kw: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Count"}], **kw}
    return httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=60)


def sse_data(lines: Iterator[str]) -> Iterator[Any]:
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            yield data if data == "[DONE]" else json.loads(data)


def test_routing_decisions_are_pure() -> None:
    pool = UpstreamPool(model="m", urls=("http://a/v1", "http://b/v1"), failures_to_open=2)
    a, b = Replica("http://a/v1", in_flight=1), Replica("http://b/v1")
    assert pick([a, b], 0.0, 8, set()) is b  # least loaded
    assert pick([a, b], 0.0, 8, {b.url}) is a  # not tried again for the same request
    assert pick([a, b], 0.0, 1, {b.url}) is None  # a is full
    failed(b, 0.0, pool)
    assert pick([a, b], 0.0, 8, set()) is b  # one failure: still in
    failed(b, 0.0, pool)
    assert pick([a, b], 1.0, 8, set()) is a  # circuit open ...
    assert pick([a, b], 31.0, 8, set()) is b  # ... until the cool-down ends
    text = ChunkText()
    chunks = [
        {"choices": [{"delta": {"reasoning_content": "hm"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x"'}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3}},
    ]
    out = "".join(text.feed(c) for c in chunks) + text.close()
    assert (
        out
        == '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert text.usage is not None and text.usage.prompt_tokens == 3


def test_upstreams_file_is_checked_at_start(tmp_path: Path) -> None:
    from toolflash.commands import serve
    from toolflash.gateway.upstream_config import load_upstreams

    path = tmp_path / "pools.yaml"
    pool = {"model": "m", "urls": ["http://127.0.0.1:1/v1"], "api_key_env": "TF_TEST_UNSET_KEY"}
    path.write_text(json.dumps({"pools": [pool]}))
    with pytest.raises(ValueError, match="TF_TEST_UNSET_KEY is not set"):
        load_upstreams(path)
    path.write_text(json.dumps({"pools": [{**pool, "api_key_env": None}] * 2}))
    with pytest.raises(ValueError, match="pools with the same name: m"):
        load_upstreams(path)
    path.write_text("pools: [{model: m, urls: [ftp://x]}]")
    with pytest.raises(ValueError, match="not an http"):
        load_upstreams(path)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args(["--upstreams", str(path), "--no-local-model"])) == 2
    assert serve.run(parser.parse_args(["--no-local-model"])) == 2


def test_pool_serves_through_the_gateway(servers: Servers) -> None:
    gw, up1 = servers.urls["gateway"], servers.urls["up1"]
    direct = httpx.post(
        f"{up1}/v1/chat/completions",
        json={"model": UPSTREAM_MODEL, "messages": [{"role": "user", "content": "Count"}]},
        timeout=60,
    ).json()
    r = chat(gw, "pool")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "pool" and r.headers["x-toolflash-mode"] == "upstream"
    message = body["choices"][0]["message"]
    assert message["content"] == direct["choices"][0]["message"]["content"]
    assert body["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    (decision,) = body["toolflash"]["decisions"]
    assert decision["mode"] == "upstream"
    # One pool: nothing chosen between pools, the record names the replica only.
    replicas = {f"routed to {servers.urls[n]}/v1" for n in ("up1", "up2")}
    assert decision["reason"] in replicas
    # Streamed: the same text, chunk by chunk, and the report in the last chunk.
    with httpx.stream(
        "POST",
        f"{gw}/v1/chat/completions",
        json={"model": "pool", "messages": [{"role": "user", "content": "Count"}], "stream": True},
        timeout=60,
    ) as s:
        events = list(sse_data(s.iter_lines()))
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == message["content"]
    assert events[-2]["toolflash"]["mode"] == "upstream"
    # A forced call: the upstream's parsed call is re-read by the gateway's parser and checked.
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    r = chat(gw, "pool", tools=[tool], tool_choice="required", max_tokens=200)
    body = r.json()
    assert r.status_code == 200, body
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    (report,) = body["toolflash"]["tool_calls"]
    assert report["parsed"] and report["schema_valid"]
    # Another dialect on the same pool, and the pools listed.
    r = httpx.post(
        f"{gw}/v1/messages",
        json={"model": "pool", "max_tokens": 30, "messages": [{"role": "user", "content": "Hi"}]},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["content"], r.text
    models = {m["id"] for m in httpx.get(f"{gw}/v1/models").json()["data"]}
    assert {"pool", "hang", "mixed"} <= models
    r = chat(gw, "nope")
    assert r.status_code == 404 and "pool" in r.json()["error"]["message"]


def test_least_loaded_and_client_gone_frees_the_slot(servers: Servers) -> None:
    gw = servers.urls["gateway"]
    body = {
        "model": "pool",
        "messages": [{"role": "user", "content": "Count"}],
        "stream": True,
        "max_tokens": 1500,
        "logit_bias": NO_EOS,
    }
    ups = [f"{servers.urls[n]}/v1" for n in ("up1", "up2")]
    with httpx.Client(timeout=60) as c1, httpx.Client(timeout=60) as c2:
        with c1.stream("POST", f"{gw}/v1/chat/completions", json=body) as a:
            lines_a = a.iter_lines()  # kept: a dropped line iterator closes its response
            next(lines_a)
            with c2.stream("POST", f"{gw}/v1/chat/completions", json=body) as b:
                lines_b = b.iter_lines()
                next(lines_b)
                assert [metric(gw, "in_flight", u) for u in ups] == [1, 1]
    deadline = time.monotonic() + 5
    while any(metric(gw, "in_flight", u) for u in ups) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [metric(gw, "in_flight", u) for u in ups] == [0, 0]


@pytest.mark.skipif(not has_mlx_server(), reason="mlx_lm.server is not installed")
def test_mlx_lm_server_as_upstream(servers: Servers) -> None:
    r = chat(servers.urls["gateway"], "mlx", max_tokens=20)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] > 0
    assert servers.urls["mlx"] in body["toolflash"]["decisions"][0]["reason"]


def test_hanging_upstream_times_out_without_leaking(servers: Servers) -> None:
    gw, hang = servers.urls["gateway"], f"{servers.urls['hang']}/v1"
    t0 = time.monotonic()
    r = chat(gw, "hang")
    assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_unavailable"
    assert time.monotonic() - t0 < 10
    assert metric(gw, "in_flight", hang) == 0
    # With a working replica behind it, the request moves on before any byte went out.
    r = chat(gw, "mixed", max_tokens=10)
    assert r.status_code == 200, r.text
    assert servers.urls["up1"] in r.json()["toolflash"]["decisions"][0]["reason"]
    assert metric(gw, "in_flight", hang) == 0
    # Silence mid-stream: the idle timeout ends it with an error event, and frees the slot.
    body = {"model": "stall", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, timeout=30) as s:
        events = list(sse_data(s.iter_lines()))
    assert events[1]["choices"][0]["delta"]["content"] == "a"
    assert events[-2]["error"]["code"] == "upstream_error" and events[-1] == "[DONE]"
    assert metric(gw, "in_flight", f"{servers.urls['stall']}/v1") == 0


def test_upstream_killed_mid_stream(servers: Servers) -> None:
    """Last: it kills one of the pool's replicas."""
    gw = servers.urls["gateway"]
    names = {f"{servers.urls[n]}/v1": n for n in ("up1", "up2")}
    body = {
        "model": "pool",
        "messages": [{"role": "user", "content": "Count"}],
        "stream": True,
        "max_tokens": 1500,
        "logit_bias": NO_EOS,
    }
    with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, timeout=60) as s:
        events = sse_data(s.iter_lines())
        for _ in range(3):
            next(events)
        (serving,) = [u for u in names if metric(gw, "in_flight", u) == 1]
        servers.kill(names[serving])
        rest = list(events)
    assert rest[-1] == "[DONE]"
    assert rest[-2]["error"]["code"] == "upstream_error", rest[-2]
    assert metric(gw, "in_flight", serving) == 0
    # The next requests go to the other replica (the failed one's circuit is open).
    for _ in range(2):
        r = chat(gw, "pool", max_tokens=10)
        assert r.status_code == 200, r.text
        assert serving not in r.json()["toolflash"]["decisions"][0]["reason"]
    assert httpx.get(f"{gw}/health").json()["upstreams"]["pool"] is True
