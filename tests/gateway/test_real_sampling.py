"""Sampled requests through the gateway around the real DFlashEngine (tiny random target and
drafter on disk, with a generation_config.json): model defaults apply, a seed reproduces the
output, and logprobs come back in both modes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import Served, serve
from toolflash.gateway.config import GatewayConfig

pytest.importorskip("mlx.core")


@pytest.fixture(scope="module", params=["spec", "ar"])
def real(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    from tests.engine.model_dirs import write_draft, write_qwen3_target
    from toolflash.engine.factory import build_engine

    root: Path = tmp_path_factory.mktemp("sampling-models")
    config = write_qwen3_target(root / "target")
    (root / "target" / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.7, "top_p": 0.9})
    )
    write_draft(root / "draft", config)
    mode = request.param

    def factory():  # type: ignore[no-untyped-def]
        return build_engine(str(root / "target"), str(root / "draft"), mode=mode)

    with serve(factory=factory, config=GatewayConfig(mode=mode)) as s:
        yield s


def ask(s: Served, **kw: object) -> dict:
    r = httpx.post(
        f"{s.v1}/chat/completions",
        json={"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 24, **kw},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_defaults_seed_and_logprobs(real: Served) -> None:
    a = ask(real, seed=5, logprobs=True, top_logprobs=2)
    info = a["toolflash"]["sampling"]
    assert info["method"] == "sample" and info["temperature"] == 0.7 and info["top_p"] == 0.9
    assert info["from_model_defaults"] == ["temperature", "top_p"]
    b = ask(real, seed=5, logprobs=True, top_logprobs=2)
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    content = a["choices"][0]["logprobs"]["content"]
    assert len(content) == a["usage"]["completion_tokens"] - (
        a["choices"][0]["finish_reason"] == "stop"
    )
    assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in content)
    texts = {ask(real, seed=s)["choices"][0]["message"]["content"] for s in range(4)}
    assert len(texts) > 1
