"""Run the gateway on a real uvicorn server on loopback (random free port) in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from tests.gateway.fake_engine import FakeEngine
from toolflash.engine.api import Engine
from toolflash.gateway.app import create_app
from toolflash.gateway.config import GatewayConfig


@dataclass
class Served:
    url: str
    engine: FakeEngine
    server: uvicorn.Server

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    def client(self, api_key: str = "none", **kw: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.v1, api_key=api_key, max_retries=0, timeout=20, **kw)  # type: ignore[arg-type]


@contextmanager
def serve(
    engine: FakeEngine | None = None,
    config: GatewayConfig | None = None,
    factory: Callable[[], Engine] | None = None,
    wait_ready: bool = True,
    app_kwargs: dict[str, Any] | None = None,
) -> Iterator[Served]:
    """Start uvicorn with the gateway around `engine` and stop it afterwards."""
    engine = engine or FakeEngine()
    app = create_app(factory or (lambda: engine), config or GatewayConfig(), **(app_kwargs or {}))
    # proto=IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets of that proto
    # (with proto 0 every response body waits ~40 ms for a delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    if wait_ready:
        while time.monotonic() < deadline:
            if httpx.get(f"{url}/health").status_code == 200:
                break
            time.sleep(0.02)
    try:
        yield Served(url, engine, server)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serve(FakeEngine()) as s:
        yield s


@pytest.fixture(scope="module")
def served_xml() -> Iterator[Served]:
    with serve(FakeEngine(tool_call_format="qwen3_coder", think_in_prompt=True)) as s:
        yield s
