"""Sparse prefill over HTTP on the real engine: opt-in per request (`sparse_prefill`), per
class (the policy hook) and per server (`--sparse-prefill`), reported in every response, and
bad values refused in the API's error shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Served, serve
from toolflash.gateway.config import GatewayConfig

pytest.importorskip("mlx.core")

BODY = " ".join(f"def f{i}(x): return x + {i}" for i in range(60))
CALLS = iter(range(10**6))


def long_chat() -> list[dict[str, str]]:
    """A long prompt no earlier request shares (the prefix cache would restore it)."""
    return [
        {"role": "system", "content": f"You are coding agent {next(CALLS)}."},
        {"role": "user", "content": BODY},
        {"role": "user", "content": "def add(a, b):"},
    ]


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.engine.model_dirs import write_draft, write_qwen3_target

    root: Path = tmp_path_factory.mktemp("sparse-models")
    write_draft(root / "draft", write_qwen3_target(root / "target"))
    return root


def served(root: Path, config: GatewayConfig, **app_kwargs: Any) -> Any:
    from toolflash.engine.factory import build_engine

    def factory():  # type: ignore[no-untyped-def]
        return build_engine(str(root / "target"), str(root / "draft"))

    return serve(factory=factory, config=config, app_kwargs=app_kwargs)


@pytest.fixture(scope="module")
def real(model_root: Path) -> Iterator[Served]:
    with served(model_root, GatewayConfig(sparse_min_tokens=64)) as s:
        yield s


def chat(s: Served, **extra: Any) -> httpx.Response:
    body = {"messages": long_chat(), "max_tokens": 8, **extra}
    return httpx.post(f"{s.v1}/chat/completions", json=body, timeout=60)


def test_a_request_opts_in_and_the_response_says_so(real: Served) -> None:
    dense = chat(real).json()
    sparse = chat(real, sparse_prefill=0.5).json()
    prompt = dense["usage"]["prompt_tokens"]
    assert prompt >= 128
    assert dense["toolflash"]["prefill_sparse"] is False
    assert dense["toolflash"]["prefill_computed_tokens"] == (
        prompt - dense["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    info = sparse["toolflash"]
    assert info["prefill_sparse"] is True
    assert prompt // 3 < info["prefill_computed_tokens"] < prompt
    # 1.0 is dense; a short prompt stays dense whatever it asks.
    assert chat(real, sparse_prefill=1.0).json()["toolflash"]["prefill_sparse"] is False
    short = httpx.post(
        f"{real.v1}/chat/completions",
        json={"messages": long_chat()[2:], "max_tokens": 4, "sparse_prefill": 0.25},
        timeout=60,
    ).json()
    assert short["toolflash"]["prefill_sparse"] is False


@pytest.mark.parametrize("value", [0, 1.5, -1, "half"])
def test_bad_keep_ratios_are_a_400(real: Served, value: Any) -> None:
    r = chat(real, sparse_prefill=value)
    assert r.status_code == 400
    assert "sparse_prefill" in r.json()["error"]["message"] + str(r.json()["error"]["param"])


def test_server_default_and_class_policy(model_root: Path) -> None:
    config = GatewayConfig(sparse_prefill=0.5, sparse_min_tokens=64)
    with served(model_root, config) as s:
        assert chat(s).json()["toolflash"]["prefill_sparse"] is True
        assert chat(s, sparse_prefill=1.0).json()["toolflash"]["prefill_sparse"] is False
    seen: list[str] = []

    def policy(model_id: str, klass: Any) -> float | None:
        seen.append(klass.label)
        return 1.0  # this class: dense, over the server's setting

    with served(model_root, config, sparse_policy=policy) as s:
        assert chat(s).json()["toolflash"]["prefill_sparse"] is False
        assert chat(s, sparse_prefill=0.5).json()["toolflash"]["prefill_sparse"] is True
    assert seen and seen[0].startswith("chat.")
