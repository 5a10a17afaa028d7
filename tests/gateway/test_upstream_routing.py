"""Routing between several pools of one model by the decode speed measured per request class
(`gateway/upstream_choice.py`), the SSE reading of upstream bodies, and connection reuse: the pure
decisions, then two scripted upstreams on loopback (each slow on one class of request) behind a
`toolflash serve --no-local-model --upstreams FILE` gateway. Every process is started here and
stopped by its PID."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.test_upstream import Servers, metric, wait_healthy
from toolflash.gateway.upstream_choice import NO_SPEED, PoolState, Speed, SpeedTable, choose
from toolflash.gateway.upstream_config import UpstreamsFile
from toolflash.gateway.upstream_wire import MalformedEvent, SseEvents
from toolflash.ports import free_port

FAST, SLOW = Speed(200.0, 5), Speed(50.0, 5)


def test_unmeasured_pool_is_tried_first() -> None:
    pools = [PoolState("a", 0.0, FAST), PoolState("b", 0.0, Speed(10.0, 1))]
    choice = choose(pools, "surplus", "chat", draw=0.9, explore_p=0.1, min_samples=3)
    assert choice.order == ("b", "a")
    assert "1 of 3 measurements" in choice.reason
    # Fewest measurements first, whatever their speed so far.
    pools = [PoolState("a", 0.0, Speed(9.0, 2)), PoolState("b", 0.0, NO_SPEED)]
    assert choose(pools, "surplus", "chat", 0.9, 0.1, 3).order == ("b", "a")


def test_fastest_measured_pool_per_class() -> None:
    table = SpeedTable()
    for _ in range(3):
        table.add("a", "chat", 200.0)
        table.add("b", "chat", 50.0)
        table.add("a", "tools", 30.0)
        table.add("b", "tools", 120.0)

    def first(label: str) -> str:
        pools = [PoolState(n, 0.0, table.get(n, label)) for n in ("a", "b")]
        return choose(pools, "surplus", label, draw=0.5, explore_p=0.1, min_samples=3).order[0]

    assert first("chat") == "a"
    assert first("tools") == "b"
    pools = [
        PoolState("a", 0.0, table.get("a", "tools")),
        PoolState("b", 0.0, table.get("b", "tools")),
    ]
    assert "+300% over a" in choose(pools, "surplus", "tools", 0.5, 0.1, 3).reason


def test_exploration_sends_a_draw_under_explore_p_to_a_slower_pool() -> None:
    pools = [
        PoolState("a", 0.0, FAST),
        PoolState("b", 0.0, SLOW),
        PoolState("c", 0.0, Speed(20.0, 5)),
    ]
    assert choose(pools, "surplus", "chat", 0.2, 0.1, 3).order[0] == "a"
    explored = {choose(pools, "surplus", "chat", d, 0.1, 3).order[0] for d in (0.0, 0.04, 0.06)}
    assert explored == {"b", "c"}
    assert "exploring" in choose(pools, "surplus", "chat", 0.0, 0.1, 3).reason
    assert choose(pools, "surplus", "chat", 0.0, 0.0, 3).order[0] == "a"  # explore_p 0: never


def test_pools_that_cannot_take_the_request_come_last_and_least_loaded_mode() -> None:
    pools = [PoolState("a", None, FAST), PoolState("b", 0.5, SLOW), PoolState("c", 0.25, SLOW)]
    assert choose(pools, "surplus", "chat", 0.9, 0.1, 3).order == ("b", "c", "a")
    assert choose(pools, "least_loaded", "chat", 0.9, 0.1, 3).order == ("c", "b", "a")
    one_free = choose(
        [PoolState("a", None, FAST), PoolState("b", 0.5)], "surplus", "c", 0.9, 0.1, 3
    )
    assert one_free.order == ("b", "a") and "the only one with a replica free" in one_free.reason
    none_free = [PoolState("a", None), PoolState("b", None)]
    assert choose(none_free, "surplus", "chat", 0.9, 0.1, 3).order == ("a", "b")


def test_speed_is_a_running_mean_with_its_count() -> None:
    speed = NO_SPEED.add(100.0).add(200.0)
    assert speed.samples == 2
    assert speed.tokens_per_s == pytest.approx(125.0)


def test_sse_events_across_reads() -> None:
    events = SseEvents()
    assert events.feed(b'data: {"a": 1}\n\ndata: {"b"') == [{"a": 1}]
    assert events.feed(b": 2}\n\n: a comment\n\n") == [{"b": 2}]
    assert events.feed(b'data: {"c": 3}\r\n\r\ndata: [DONE]\n\ndata: {"d": 4}\n\n') == [{"c": 3}]
    assert events.done
    assert events.feed(b'data: {"e": 5}\n\n') == []  # after [DONE]: read, ignored
    tail = SseEvents()
    assert tail.feed(b'data: {"f": 6}') == []
    assert tail.close() == [{"f": 6}]  # a body that ended without its newline
    with pytest.raises(MalformedEvent):
        SseEvents().feed(b"data: {not json\n\n")


def test_pools_file_names_and_route() -> None:
    pool = {"model": "m", "urls": ["http://a/v1"]}
    with pytest.raises(ValueError, match="need a `name` each"):
        UpstreamsFile.model_validate({"pools": [pool, pool]})
    with pytest.raises(ValueError, match="differ in context_length"):
        UpstreamsFile.model_validate(
            {"pools": [{**pool, "name": "x"}, {**pool, "name": "y", "context_length": 99}]}
        )
    with pytest.raises(ValueError, match="route"):
        UpstreamsFile.model_validate({"pools": [pool], "route": "fastest"})
    f = UpstreamsFile.model_validate(
        {"pools": [{**pool, "name": "x"}, {**pool, "name": "y"}, {**pool, "model": "n"}]}
    )
    assert f.route == "surplus"
    assert [[p.pool_name for p in g] for g in f.models().values()] == [["x", "y"], ["n"]]


# An OpenAI-compatible upstream that streams `n` chunks with a delay between them: `slow_on`
# ("tools" or "chat") names the requests it decodes 4x slower. GET /stats: completions served
# and the client port each came from (one port: one kept-alive connection).
SCRIPTED = textwrap.dedent(
    """
    import asyncio, json, sys
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    SLOW_ON = sys.argv[2]
    posts, ports = [], []

    def chunk(delta, finish=None, usage=None):
        c = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            c["usage"] = usage
        return "data: " + json.dumps(c) + "\\n\\n"

    async def completions(request):
        body = await request.json()
        kind = "tools" if body.get("tools") else "chat"
        posts.append(kind)
        ports.append(request.client.port)
        n = int(body.get("max_tokens") or 16)
        delay = 0.02 if kind == SLOW_ON else 0.005
        async def events():
            yield chunk({"role": "assistant", "content": ""})
            for _ in range(n):
                await asyncio.sleep(delay)
                yield chunk({"content": "tok "})
            yield chunk({}, "length", {"prompt_tokens": 5, "completion_tokens": n})
            yield "data: [DONE]\\n\\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def stats(request):
        return JSONResponse({"posts": posts, "ports": ports})

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/health", health), Route("/stats", stats)])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
                timeout_keep_alive=600)
    """
)
# An upstream that sends its whole answer and `[DONE]` in a chunked body, then never ends the
# body (no terminating chunk, the connection kept open).
LINGER = textwrap.dedent(
    """
    import asyncio, json, sys
    def chunk(text):
        return b"%x\\r\\n%s\\r\\n" % (len(text), text)
    async def serve(reader, writer):
        head = await reader.readuntil(b"\\r\\n\\r\\n")
        if head.startswith(b"GET"):
            writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\n{}")
            await writer.drain(); writer.close(); return
        length = int(head.lower().split(b"content-length: ")[1].split(b"\\r\\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\n"
                     b"transfer-encoding: chunked\\r\\n\\r\\n")
        for text in ("lin", "ger"):
            delta = {"choices": [{"index": 0, "delta": {"content": text}}]}
            writer.write(chunk(b"data: " + json.dumps(delta).encode() + b"\\n\\n"))
        writer.write(chunk(b"data: [DONE]\\n\\n"))
        await writer.drain()
        await asyncio.sleep(3600)
    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
        await server.serve_forever()
    asyncio.run(main())
    """
)
TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    tmp = tmp_path_factory.mktemp("routing")
    s = Servers(tmp)
    try:
        for name, slow_on in (("a", "tools"), ("b", "chat")):
            port = free_port()
            s.start(name, [sys.executable, "-c", SCRIPTED, str(port), slow_on], port)
        port = free_port()
        s.start("linger", [sys.executable, "-c", LINGER, str(port)], port)
        common = {"model": "m", "health_interval_s": 3600}
        pools: dict[str, Any] = {
            "route": "surplus",
            "min_samples": 2,
            "explore_p": 0.0,
            "pools": [
                {**common, "name": "a", "urls": [f"{s.urls['a']}/v1"]},
                {**common, "name": "b", "urls": [f"{s.urls['b']}/v1"]},
                {"model": "linger", "urls": [f"{s.urls['linger']}/v1"], "idle_timeout_s": 20},
            ],
        }
        (tmp / "upstreams.yaml").write_text(json.dumps(pools))
        port = free_port()
        s.start(
            "gateway",
            ["toolflash", "serve", "--no-local-model", "--upstreams", str(tmp / "upstreams.yaml")]
            + ["--port", str(port)],
            port,
        )
        for name in s.procs:
            wait_healthy(s.urls[name], s.procs[name])
        yield s
    finally:
        s.stop_all()


def routed_pool(gateway: str, tools: bool, stream: bool = False) -> str:
    """The pool a request went to, from the response's decision record."""
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "Count"}],
        "max_tokens": 12,
    }
    if tools:
        body["tools"] = [TOOL]
    r = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (decision,) = r.json()["toolflash"]["decisions"]
    reason = decision["reason"]
    assert reason.startswith("routed to http://127.0.0.1:")
    return reason.split("(pool ", 1)[1].split(":", 1)[0]


def test_each_class_goes_to_the_pool_that_decodes_it_fastest(scripted: Servers) -> None:
    gw = scripted.urls["gateway"]
    # Two measurements of each pool per class (min_samples), then every request of the class
    # goes to its fastest pool: b for tool turns (a is slow on them), a for chat.
    assert [routed_pool(gw, tools=True) for _ in range(4)] == ["a", "b", "a", "b"]
    assert [routed_pool(gw, tools=True) for _ in range(3)] == ["b"] * 3
    assert [routed_pool(gw, tools=False) for _ in range(4)] == ["a", "b", "a", "b"]
    assert [routed_pool(gw, tools=False) for _ in range(3)] == ["a"] * 3
    posts = {n: httpx.get(f"{scripted.urls[n]}/stats").json()["posts"] for n in ("a", "b")}
    assert posts["a"].count("tools") == 2 and posts["b"].count("tools") == 5
    assert posts["a"].count("chat") == 5 and posts["b"].count("chat") == 2
    speeds = {
        (m["pool"], m["kind"]): float(m["value"])
        for m in re.finditer(
            r'^toolflash:upstream_decode_tokens_per_s\{class="(?P<kind>[a-z]+)\.[^"]*",'
            r'model="m",pool="(?P<pool>\w)"\} (?P<value>\S+)$',
            httpx.get(f"{gw}/metrics").text,
            re.M,
        )
    }
    assert speeds[("a", "chat")] > 2 * speeds[("b", "chat")]
    assert speeds[("b", "tools")] > 2 * speeds[("a", "tools")]


def test_requests_reuse_the_upstream_connection(scripted: Servers) -> None:
    gw = scripted.urls["gateway"]
    for stream in (False, True):
        body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        for _ in range(4):
            with httpx.stream(
                "POST", f"{gw}/v1/chat/completions", json={**body, "stream": stream}, timeout=60
            ) as r:
                assert r.status_code == 200
                r.read()
    # Every completion rides a kept-alive connection (a second one may come from a request that
    # overlapped the gateway's first health check); a connection per request would be a port
    # per request. Chat goes to a (fastest) once each pool has its two measurements.
    ports = {n: httpx.get(f"{scripted.urls[n]}/stats").json()["ports"] for n in ("a", "b")}
    assert len(ports["a"]) >= 6
    assert len(set(ports["a"])) <= 2, ports
    assert len(set(ports["b"])) <= 2, ports


def test_an_answer_is_not_held_by_a_body_that_does_not_end(scripted: Servers) -> None:
    """`[DONE]` ends the answer: the client has it at once though the upstream keeps its body
    open; the gateway closes that connection soon after (the slot is free again)."""
    gw = scripted.urls["gateway"]
    body = {"model": "linger", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    for _ in range(2):
        t0 = time.monotonic()
        r = httpx.post(f"{gw}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "linger"
        assert time.monotonic() - t0 < 5  # far under the 20 s idle timeout
    deadline = time.monotonic() + 5
    while metric(gw, "in_flight", f"{scripted.urls['linger']}/v1") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(gw, "in_flight", f"{scripted.urls['linger']}/v1") == 0


def test_streams_pass_through_as_the_upstream_sends(scripted: Servers) -> None:
    """No buffering: the routed stream's content arrives spread over the upstream's own pacing
    (40 chunks 5 ms apart), not at once at the end."""
    gw = scripted.urls["gateway"]
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 40,
        "stream": True,
    }
    arrivals = []
    with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"tok' in line.replace(" ", ""):
                arrivals.append(time.monotonic())
    assert len(arrivals) >= 5
    assert arrivals[-1] - arrivals[0] > 0.1  # the upstream took ~0.2 s to send them
