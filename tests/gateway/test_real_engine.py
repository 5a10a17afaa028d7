"""The gateway around the real DFlashEngine (tiny random target + drafter written to disk):
the plumbing the fake engine cannot prove (tokenizer, chat template, cycles, MLX memory)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import Served, serve

pytest.importorskip("mlx.core")


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tests.engine.model_dirs import write_draft, write_qwen3_target
    from toolflash.engine.factory import build_engine

    root: Path = tmp_path_factory.mktemp("gateway-models")
    config = write_qwen3_target(root / "target")
    write_draft(root / "draft", config)

    def factory():  # type: ignore[no-untyped-def]
        return build_engine(str(root / "target"), str(root / "draft"))

    with serve(factory=factory) as s:
        yield s


def test_chat_stream_equals_non_stream_on_the_real_engine(real: Served) -> None:
    c = real.client()
    kw = {
        "model": str(real_model(real)),
        "messages": [{"role": "user", "content": "def add(a, b):"}],
        "max_tokens": 24,
    }
    whole = c.chat.completions.create(**kw)
    chunks = list(
        c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    reasoning = "".join(
        (ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for ch in chunks
        if ch.choices
    )
    assert text == (whole.choices[0].message.content or "")
    assert reasoning == (
        (whole.choices[0].message.model_extra or {}).get("reasoning_content") or ""
    )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    tf = whole.model_extra["toolflash"]
    assert tf["spec_cycles"] > 0 and tf["drafted"] > 0 and tf["modes"] == ["spec"]


def real_model(s: Served) -> str:
    return httpx.get(f"{s.v1}/models").json()["data"][0]["id"]


def test_completions_and_metrics_on_the_real_engine(real: Served) -> None:
    c = real.client()
    r = c.completions.create(model=real_model(real), prompt="import os", max_tokens=8)
    assert r.usage is not None and 1 <= r.usage.completion_tokens <= 8
    metrics = httpx.get(f"{real.url}/metrics").text
    assert "toolflash:mlx_active_memory_bytes" in metrics
    assert "toolflash:spec_decode_num_drafts_total" in metrics


def test_prompt_beyond_real_context(real: Served) -> None:
    r = httpx.post(
        f"{real.v1}/chat/completions",
        json={"messages": [{"role": "user", "content": "word " * 3000}]},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
