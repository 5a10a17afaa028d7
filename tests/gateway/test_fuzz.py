"""Bounded schemathesis fuzz of /openapi.json against the running gateway: never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402

from tests.gateway.conftest import Served, serve  # noqa: E402
from tests.gateway.fake_engine import FakeEngine  # noqa: E402
from toolflash import __version__  # noqa: E402
from toolflash.gateway.config import GatewayConfig  # noqa: E402
from toolflash.gateway.openapi import openapi_document  # noqa: E402

schema = schemathesis.openapi.from_dict(openapi_document(__version__))
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
)


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[Served]:
    # Small outputs keep each case fast; a short context exercises the context check too.
    with serve(FakeEngine(context_length=1024), GatewayConfig(default_max_tokens=16)) as s:
        yield s


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case: schemathesis.Case, fuzz_server: Served) -> None:
    response = case.call(base_url=fuzz_server.url, timeout=10)
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400 and response.status_code != 405:
        body = response.json()
        assert set(body["error"]) == {"message", "type", "param", "code"}
