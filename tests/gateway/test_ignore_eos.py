"""vLLM's `ignore_eos` request field on the OpenAI routes reaches the engine's request (decode
through the end-of-turn tokens: fixed-length benchmarks without a logit bias)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.conftest import Served, serve
from tests.gateway.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serve(FakeEngine()) as s:
        yield s


def post(s: Served, route: str, **kw: object) -> httpx.Response:
    body: dict[str, object] = {"max_tokens": 4, **kw}
    if route == "chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return httpx.post(f"{s.v1}/{route}", json=body, timeout=10)


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
@pytest.mark.parametrize("sent", [True, False, None])
def test_ignore_eos_reaches_the_engine(served: Served, route: str, sent: bool | None) -> None:
    r = post(served, route, **({} if sent is None else {"ignore_eos": sent}))
    assert r.status_code == 200, r.text
    assert served.engine.last_request is not None
    assert served.engine.last_request.ignore_eos is (sent is True)
    assert "ignore_eos" not in r.json()["toolflash"]["ignored_fields"]


def test_a_non_boolean_ignore_eos_is_a_400_naming_it(served: Served) -> None:
    r = post(served, "chat/completions", ignore_eos=[1])
    assert r.status_code == 400
    assert "ignore_eos" in r.json()["error"]["message"] + str(r.json()["error"]["param"])
