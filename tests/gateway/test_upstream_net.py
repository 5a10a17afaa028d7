"""The upstream client's asyncio network backend raises what httpcore's own backend raises (the
pool and the retries before the first chunk know only those), and reuses a kept-alive
connection until the server closes it."""

from __future__ import annotations

import asyncio

import httpcore
import pytest

from toolflash.gateway.upstream_net import AsyncioBackend
from toolflash.ports import free_port

REPLY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


async def _server(handler: object) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/"


def test_connect_refused_and_read_timeout_are_httpcores() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)  # never answers

    async def main() -> None:
        async with httpcore.AsyncConnectionPool(network_backend=AsyncioBackend()) as pool:
            with pytest.raises(httpcore.ConnectError):
                await pool.request("GET", f"http://127.0.0.1:{free_port()}/")
            server, url = await _server(silent)
            async with server:
                with pytest.raises(httpcore.ReadTimeout):
                    await pool.request("GET", url, extensions={"timeout": {"read": 0.2}})

    asyncio.run(main())


def test_kept_alive_connection_is_reused_until_the_server_closes_it() -> None:
    connections: list[int] = []

    async def answer_twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        for _ in range(2):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(REPLY)
            await writer.drain()
        writer.close()  # after two answers: the pool must notice, not send a third here

    async def main() -> None:
        server, url = await _server(answer_twice)
        async with server, httpcore.AsyncConnectionPool(network_backend=AsyncioBackend()) as pool:
            for _ in range(4):
                response = await pool.request("GET", url)
                assert response.status == 200 and response.content == b"ok"
                await asyncio.sleep(0.05)  # the close reaches the client between requests
        assert len(connections) == 2

    asyncio.run(main())
