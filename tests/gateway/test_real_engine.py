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


def test_messages_route_decodes_as_chat_on_the_real_engine(real: Served) -> None:
    """The same conversation, greedy, through /v1/messages (anthropic SDK) and
    /v1/chat/completions: the same text and token counts; streamed equals not."""
    anthropic = pytest.importorskip("anthropic")
    model = real_model(real)
    c = anthropic.Anthropic(base_url=real.url, api_key="none", max_retries=0, timeout=60)
    kw = {"model": model, "system": "be brief", "max_tokens": 24}
    user = [{"role": "user", "content": "def add(a, b):"}]
    a = c.messages.create(messages=user, **kw)
    with c.messages.stream(messages=user, **kw) as stream:
        s = stream.get_final_message()
    o = real.client().chat.completions.create(
        model=model,
        max_tokens=24,
        messages=[{"role": "system", "content": "be brief"}, *user],
    )
    msg = o.choices[0].message
    text = "".join(b.text for b in a.content if b.type == "text")
    thinking = "".join(b.thinking for b in a.content if b.type == "thinking")
    assert text == (msg.content or "")
    assert thinking == ((msg.model_extra or {}).get("reasoning_content") or "")
    assert [b.model_dump() for b in s.content] == [b.model_dump() for b in a.content]
    assert a.usage.output_tokens == s.usage.output_tokens == o.usage.completion_tokens  # type: ignore[union-attr]
    prompt = a.usage.input_tokens + (a.usage.cache_read_input_tokens or 0)
    assert prompt == o.usage.prompt_tokens  # type: ignore[union-attr]
    assert a.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[o.choices[0].finish_reason]
