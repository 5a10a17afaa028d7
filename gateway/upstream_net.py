"""The upstream client's transport: an httpcore network backend on asyncio's streams.

httpcore's default async backend goes through anyio, whose stream read and per-read
cancel scope cost ~20-25 us of CPU per network read. A streamed upstream response is read one
token at a time, so that cost is paid per token (on 2 cores, ~2000 chunks: ~83 us a chunk
through anyio, ~58 us through this backend, ~25 us for a bare asyncio read; `.work` scratch
measurement, see benchmarks/results/README.md). httpcore's own HTTP/1.1 handling (h11),
pooling and timeouts stay as they are: this is its documented `network_backend` extension
point, mapping errors to the exceptions its anyio backend raises.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore


def _error(exc: OSError, timeout: type[Exception], other: type[Exception]) -> Exception:
    """httpcore's exception for an OS error (its pool and the retries know only those)."""
    kind = timeout if isinstance(exc, TimeoutError) else other
    return kind(str(exc) or type(exc).__name__)


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection as an asyncio reader and writer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            if timeout is None:
                return await self._reader.read(max_bytes)
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except OSError as exc:  # TimeoutError is one
            raise _error(exc, httpcore.ReadTimeout, httpcore.ReadError) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except OSError as exc:
            raise _error(exc, httpcore.WriteTimeout, httpcore.WriteError) from exc

    async def aclose(self) -> None:
        self._writer.close()  # no wait for the close: a broken peer must not hold the pool

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except OSError as exc:
            raise _error(exc, httpcore.ConnectTimeout, httpcore.ConnectError) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # What httpcore asks of an idle pooled connection: did the server close it? (The
            # transport reads the socket itself, so the socket would not say.)
            return self._reader.at_eof()
        name = {"client_addr": "sockname", "server_addr": "peername"}.get(info, info)
        if name in ("ssl_object", "sockname", "peername", "socket"):
            return self._writer.get_extra_info(name)
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """TCP connections over asyncio's streams (TCP_NODELAY is asyncio's and uvloop's default
    for TCP transports)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=(local_address, 0) if local_address else None
                )
            sock = writer.get_extra_info("socket")
            for option in socket_options or ():
                sock.setsockopt(*option)
        except OSError as exc:
            raise _error(exc, httpcore.ConnectTimeout, httpcore.ConnectError) from exc
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
