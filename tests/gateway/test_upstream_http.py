"""The gateway's upstream client (`gateway/upstream_http.py`): errors in its one family, the
idle-read timeout, bodies by length, chunks or close, kept-alive connections reused until the
server closes them (and a stale one replaced once), and a body read a network read at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from toolflash.gateway.upstream_http import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamNetError,
    UpstreamTimeout,
)
from toolflash.ports import free_port

REPLY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
# Both loops the client runs on: uvloop (serve) and asyncio's own.
LOOPS = pytest.mark.parametrize("loop", [asyncio.new_event_loop, uvloop.new_event_loop])


def _run(main: Awaitable[None], loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    with asyncio.Runner(loop_factory=loop) as runner:
        runner.run(main)  # type: ignore[arg-type]


async def _server(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/"


@LOOPS
def test_connect_refused_and_read_timeout(loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)  # never answers

    async def main() -> None:
        client = UpstreamClient()
        with pytest.raises(UpstreamConnectError):
            await client.request("GET", f"http://127.0.0.1:{free_port()}/")
        server, url = await _server(silent)
        async with server:
            with pytest.raises(UpstreamTimeout):
                await client.request("GET", url, timeout_s=0.2)
        await client.aclose()

    _run(main(), loop)


@LOOPS
def test_idle_timeout_is_the_silence_between_reads_not_the_whole_body(
    loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(6):  # 0.6 s in all, never 0.25 s of silence
            await asyncio.sleep(0.1)
            writer.write(b"1\r\nx\r\n")
        writer.write(b"0\r\n\r\n")
        await reader.read()  # the client keeps the connection: wait for its close

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n")
        await asyncio.sleep(5)

    async def main() -> None:
        client = UpstreamClient()
        server, url = await _server(slow)
        async with server:
            status, body = await client.request("GET", url, timeout_s=0.25)
            assert (status, body) == (200, b"x" * 6)
            await client.aclose()
        server, url = await _server(stalls)
        async with server:
            async with client.stream("GET", url, read_timeout_s=0.25) as response:
                parts = []
                with pytest.raises(UpstreamTimeout):
                    async for part in response.aiter_stream():
                        parts.append(part)
                assert parts == [b"x"]  # what came before the silence was handed out
        await client.aclose()

    _run(main(), loop)


@LOOPS
def test_bodies_by_length_chunks_and_close_and_a_broken_one(
    loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    replies = [
        b"HTTP/1.1 201 Created\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nuntil close",  # no length: the close ends it
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",  # closed before its length
        b"NOT HTTP\r\n\r\n",
    ]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(replies.pop(0))
        await writer.drain()
        writer.close()

    async def main() -> None:
        client = UpstreamClient()
        server, url = await _server(answer)
        async with server:
            assert await client.request("GET", url) == (201, b"hello")
            assert await client.request("GET", url) == (200, b"abcde")
            assert await client.request("GET", url) == (200, b"until close")
            with pytest.raises(UpstreamNetError, match="closed"):
                await client.request("GET", url)
            with pytest.raises(UpstreamNetError, match="not valid HTTP"):
                await client.request("GET", url)
        await client.aclose()

    _run(main(), loop)


@LOOPS
def test_kept_alive_connection_is_reused_until_the_server_closes_it(
    loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    connections: list[int] = []
    requests: list[bytes] = []

    async def answer_twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        for _ in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            requests.append(head.split(b"\r\n")[0] + b" " + await reader.readexactly(n))
            writer.write(REPLY)
            await writer.drain()
        writer.close()  # after two answers: the client must notice, not send a third here

    async def main() -> None:
        client = UpstreamClient()
        server, url = await _server(answer_twice)
        async with server:
            for i in range(4):
                async with client.stream("POST", f"{url}v1?x={i}", content=b"{}") as response:
                    assert response.status == 200 and await response.aread() == b"ok"
                await asyncio.sleep(0.05)  # the close reaches the client between requests
        await client.aclose()
        assert len(connections) == 2
        assert requests == [f"POST /v1?x={i} HTTP/1.1 {{}}".encode() for i in range(4)]

    _run(main(), loop)


@LOOPS
def test_a_stale_kept_alive_connection_is_replaced_once(
    loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """A server that closes an idle connection just as it is reused (the close not yet seen):
    the request goes once more on a new connection instead of failing."""
    connections: list[int] = []

    async def once_then_close_on_next(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(REPLY)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the reuse: closed without an answer
        writer.close()

    async def main() -> None:
        client = UpstreamClient()
        server, url = await _server(once_then_close_on_next)
        async with server:
            assert await client.request("GET", url) == (200, b"ok")
            assert await client.request("GET", url) == (200, b"ok")
        await client.aclose()
        assert len(connections) == 2

    _run(main(), loop)


@LOOPS
def test_a_response_left_unread_closes_its_connection(
    loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    connections: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nab")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"cd")

    async def main() -> None:
        client = UpstreamClient()
        server, url = await _server(answer)
        async with server:
            async with client.stream("GET", url) as response:
                assert response.status == 200  # the body is not read
            assert await client.request("GET", url) == (200, b"abcd")
            assert await client.request("GET", url) == (200, b"abcd")
        await client.aclose()
        assert len(connections) == 2  # the unread one closed; the read one reused

    _run(main(), loop)


@LOOPS
def test_body_comes_a_read_at_a_time_in_order(
    loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """Each network read's body bytes come out as they arrive (a stream is not held for the
    next read), in order, and a large body is all there."""
    pieces = [f"data: {i}\n\n".encode() for i in range(50)]
    big = bytes(range(256)) * 4096  # 1 MiB: past the read pause's high-water mark

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.002)
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big))
        await writer.drain()
        await reader.read()

    async def main() -> None:
        client = UpstreamClient()
        server, url = await _server(stream)
        async with server:
            async with client.stream("GET", url) as response:
                got = []
                async for part in response.aiter_stream():
                    got.append(part)
                    await asyncio.sleep(0)
        await client.aclose()
        joined = b"".join(got)
        assert joined == b"".join(pieces) + big
        assert len(got) > len(pieces) // 2  # read as they came, not in one piece at the end

    _run(main(), loop)
