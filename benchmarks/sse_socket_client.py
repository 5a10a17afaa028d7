"""A minimal HTTP client for benchmarks: one POST over a plain socket, the response read as it
comes and parsed once at the end. Per streamed chunk it costs one `recv` and one byte search,
where httpx + `iter_lines` + `json.loads` per chunk cost the benchmark's client ~75 us of CPU a
token on a machine whose cores the server also needs (`gateway_overhead.py --client socket`)."""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Any
from urllib.parse import urlsplit

# A delta with text in it (the role chunk's `"content":""` is not one).
_TEXT = re.compile(rb'"(?:reasoning_)?content":"[^"]')


def _dechunk(body: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = body.index(b"\r\n", i)
        size = int(body[i:j].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[j + 2 : j + 2 + size]
        i = j + 2 + size + 2


def post(url: str, body: dict[str, Any], stream: bool) -> tuple[float, float | None, Any]:
    """POST `body` as JSON: (seconds until the server closed the response, seconds until the
    first chunk with text (streams), the response's JSON: the whole body, or for a stream the
    last `data:` object that has a `usage`)."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    request = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + payload
    received: list[bytes] = []
    ttft = None
    t0 = time.perf_counter()
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(request)
        while data := s.recv(65536):
            received.append(data)
            if ttft is None and stream and _TEXT.search(data):
                ttft = time.perf_counter() - t0
    e2e = time.perf_counter() - t0
    head, _, raw = b"".join(received).partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    if b"transfer-encoding: chunked" in head.lower():
        raw = _dechunk(raw)
    if status != b"200":
        raise RuntimeError(f"HTTP {status.decode()}: {raw[:500]!r}")
    if not stream:
        return e2e, None, json.loads(raw)
    last = None
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                last = chunk
    if last is None:
        raise RuntimeError(f"no usage chunk in the stream: {raw[-500:]!r}")
    return e2e, ttft, last
