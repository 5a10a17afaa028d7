"""The upstream client: HTTP/1.1 on asyncio protocols, responses parsed by httptools.

A routed stream is read one network read per token, so what a read costs is paid per token.
Through httpcore (its h11 parser in Python, its stream layers and an `asyncio.timeout` per read)
a read cost ~60 us of the gateway's CPU; here a read is the protocol's `data_received`, parsed
by httptools (C, already uvicorn's parser), its body bytes handed to the waiting reader (see
benchmarks/results/README.md, "Routed streaming, one protocol a connection"). What the client
keeps of httpcore's: keep-alive connections per origin, reused until the server closes one or a
response is left unread; connect and idle-read timeouts; TLS; one exception family
(`UpstreamNetError`) for every transport failure.

The idle-read timeout is one timer per response, re-armed only when it fires (a read just
stamps the time): the longest silence between two reads, as httpcore's per-read timeout was.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import cast
from urllib.parse import SplitResult, urlsplit

import httptools

# Body bytes buffered before the connection stops reading from the socket (a reader that
# falls behind holds the upstream back instead of growing the buffer).
HIGH_WATER = 1 << 18


class UpstreamNetError(Exception):
    """The connection failed: refused, reset, closed mid-response, or not HTTP."""


class UpstreamConnectError(UpstreamNetError):
    """No connection could be made."""


class UpstreamTimeout(UpstreamNetError):
    """Connecting, or a silence between two reads, took longer than its timeout."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: a request written whole, its response parsed as it arrives."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._paused = False  # reading stopped: the body buffered is over HIGH_WATER
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.received = False  # any byte of this response
        self.error: Exception | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._idle_s = 0.0
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        self._last = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamNetError(f"the upstream's response is not valid HTTP: {exc}"))
            self.close()
        self._wake()

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.head_done and exc is None and self._until_close():
            self.complete = True  # a body delimited by the close: this close ends it
        elif not self.complete and self.error is None:
            why = f": {exc!r}" if exc is not None else ""
            self.error = UpstreamNetError(f"the upstream closed the connection{why}")
        self._stop_timer()
        self._wake()

    # -- httptools callbacks -----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        self._stop_timer()
        if not self._parser.should_keep_alive():
            self.close()

    # -- the request -------------------------------------------------------------------
    def send(self, head: bytes, body: bytes, idle_s: float | None) -> None:
        """Write a request (head and body in one write) and start its idle timer."""
        assert self._transport is not None
        self._reset()
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        if idle_s:
            self._idle_s = idle_s
            self._last = self._loop.time()
            self._timer = self._loop.call_at(self._last + idle_s, self._check_idle)
        self._transport.write(head + body)

    def take(self) -> bytes:
        """The body bytes received and not yet taken (b"" for none)."""
        body, self._body, self._buffered = self._body, [], 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return body[0] if len(body) == 1 else b"".join(body)

    async def wait(self) -> None:
        """Until something arrives: bytes, the end, or a failure."""
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        self.closed = True
        self._stop_timer()
        if self._transport is not None:
            self._transport.close()

    def _until_close(self) -> bool:
        names = {name for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self.error is None and not self.complete:
            self.error = exc

    def _check_idle(self) -> None:
        self._timer = None
        if self.complete or self.error is not None:
            return
        due = self._last + self._idle_s
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check_idle)
            return
        self._fail(UpstreamTimeout(f"the upstream sent nothing for {self._idle_s:g} s"))
        self.close()
        self._wake()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class UpstreamResponse:
    """A response whose head has arrived; its body is read with `aiter_stream` or `aread`."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers

    async def aiter_stream(self) -> AsyncIterator[bytes]:
        """The body as it arrives, a network read's worth at a time."""
        conn = self._conn
        while True:
            data = conn.take()
            if data:
                yield data
                continue
            if conn.error is not None:
                raise conn.error
            if conn.complete:
                return
            await conn.wait()

    async def aread(self) -> bytes:
        return b"".join([part async for part in self.aiter_stream()])


class UpstreamClient:
    """Keep-alive HTTP/1.1 connections per origin (`scheme://host:port`)."""

    def __init__(self, max_idle_per_origin: int = 64) -> None:
        self._idle: dict[str, list[_Connection]] = {}
        self._max_idle = max_idle_per_origin
        self._tls: ssl.SSLContext | None = None

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[tuple[bytes, bytes]] = (),
        content: bytes = b"",
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
    ) -> AsyncIterator[UpstreamResponse]:
        """The response to one request once its head has arrived; its connection goes back to
        the pool if the body was read to its end and the server keeps it open."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"{method} {target} HTTP/1.1\r\nhost: {parts.netloc}\r\n".encode()]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        if content or method in ("POST", "PUT", "PATCH"):
            head.append(b"content-length: %d\r\n" % len(content))
        request = b"".join(head) + b"\r\n"
        conn, reused = await self._acquire(origin, parts, connect_timeout_s)
        try:
            try:
                await self._head(conn, request, content, read_timeout_s)
            except UpstreamNetError as exc:
                if not reused or conn.received or isinstance(exc, UpstreamTimeout):
                    raise
                # A kept-alive connection the server closed as we reused it: once more, anew.
                conn.close()
                conn = await self._connect(origin, parts, connect_timeout_s)
                await self._head(conn, request, content, read_timeout_s)
            yield UpstreamResponse(conn)
        finally:
            self._release(origin, conn)

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[tuple[bytes, bytes]] = (),
        timeout_s: float | None = None,
    ) -> tuple[int, bytes]:
        """A whole response's status and body."""
        async with self.stream(
            method, url, headers=headers, connect_timeout_s=timeout_s, read_timeout_s=timeout_s
        ) as response:
            return response.status, await response.aread()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    @staticmethod
    async def _head(conn: _Connection, request: bytes, content: bytes, idle: float | None) -> None:
        conn.send(request, content, idle)
        while not conn.head_done:
            if conn.error is not None:
                raise conn.error
            await conn.wait()

    async def _acquire(
        self, origin: str, parts: SplitResult, timeout: float | None
    ) -> tuple[_Connection, bool]:
        """A kept-alive connection to `origin` (True) or a new one (False)."""
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn, True
        return await self._connect(origin, parts, timeout), False

    async def _connect(self, origin: str, parts: SplitResult, timeout: float | None) -> _Connection:
        host = parts.hostname or "localhost"
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    _Connection,
                    host,
                    port,
                    ssl=self._tls if tls else None,
                    server_hostname=host if tls else None,
                )
        except TimeoutError:
            raise UpstreamTimeout(f"connecting to {origin} took over {timeout:g} s") from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {origin}: {exc}") from exc
        return conn

    def _release(self, origin: str, conn: _Connection) -> None:
        if conn.closed or not conn.complete or conn.error is not None:
            conn.close()  # a response left unread or broken: the connection cannot carry another
            return
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= self._max_idle:
            conn.close()
            return
        idle.append(conn)
