"""Sampling and logprobs through the gateway with the fake engine: model defaults merge under
request fields, OpenAI's logprobs shapes in chat and completions, stream and non-stream."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.conftest import Served, serve
from tests.gateway.fake_engine import FakeEngine

QWEN_DEFAULTS = {"temperature": 0.6, "top_p": 0.95, "top_k": 20.0}


@pytest.fixture(scope="module")
def qwen_like() -> Iterator[Served]:
    with serve(FakeEngine(generation_defaults=QWEN_DEFAULTS)) as s:
        yield s


def chat(s: Served, **kw: object) -> dict:
    r = httpx.post(
        f"{s.v1}/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], **kw},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_model_defaults_fill_what_the_request_leaves_out(qwen_like: Served) -> None:
    info = chat(qwen_like)["toolflash"]["sampling"]
    assert (info["method"], info["temperature"], info["top_p"], info["top_k"]) == (
        "sample",
        0.6,
        0.95,
        20,
    )
    assert info["from_model_defaults"] == ["temperature", "top_p", "top_k"]
    info = chat(qwen_like, temperature=1.0, top_p=0.5, seed=3)["toolflash"]["sampling"]
    assert (info["temperature"], info["top_p"], info["top_k"], info["seed"]) == (1.0, 0.5, 20, 3)
    assert info["from_model_defaults"] == ["top_k"]
    # temperature 0 is greedy whatever the defaults say
    info = chat(qwen_like, temperature=0)["toolflash"]["sampling"]
    assert info["method"] == "greedy" and info["from_model_defaults"] == []
    assert qwen_like.engine.last_request is not None
    assert qwen_like.engine.last_request.sampling.greedy


def test_sampled_requests_are_their_own_class(qwen_like: Served, served: Served) -> None:
    """The class follows the effective sampling: a model default temperature makes a request
    sampled, temperature 0 makes it greedy; completions are classified the same way."""
    assert chat(qwen_like)["toolflash"]["request_class"] == "chat.sampled.think-default.user.lt1k"
    greedy = chat(qwen_like, temperature=0)["toolflash"]["request_class"]
    assert greedy == "chat.think-default.user.lt1k"
    assert chat(served)["toolflash"]["request_class"] == "chat.think-default.user.lt1k"
    sampled = chat(served, temperature=0.7)["toolflash"]["request_class"]
    assert sampled == "chat.sampled.think-default.user.lt1k"
    r = httpx.post(f"{qwen_like.v1}/completions", json={"prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["toolflash"]["request_class"] == "chat.sampled.think-default.user.lt1k"
    text = httpx.get(f"{qwen_like.url}/metrics").text
    assert 'request_class="chat.sampled.think-default.user.lt1k"' in text


def test_out_of_vocab_logit_bias_is_a_400_naming_the_field(served: Served) -> None:
    r = httpx.post(
        f"{served.v1}/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1114112": 1}},
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "logit_bias"
    ok = chat(served, logit_bias={"1114111": 1})
    assert ok["toolflash"]["sampling"]["logit_bias_tokens"] == 1


def test_chat_logprobs_non_stream(served: Served) -> None:
    r = served.client().chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "SCRIPT:abc"}],
        logprobs=True,
        top_logprobs=2,
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert [t.token for t in lp.content] == ["a", "b", "c"]
    assert all(
        t.logprob == pytest.approx(-0.1) and t.bytes == list(t.token.encode()) for t in lp.content
    )
    assert [[a.token for a in t.top_logprobs] for t in lp.content][0] == ["a", "?"]
    plain = served.client().chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "SCRIPT:abc"}], logprobs=False
    )
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_stream_cover_every_token_once(served: Served) -> None:
    text = "SCRIPT:one two three four"
    chunks = list(
        served.client().chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": text}],
            logprobs=True,
            stream=True,
        )
    )
    tokens = [
        t.token
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs is not None
        for t in ch.choices[0].logprobs.content or []
    ]
    assert "".join(tokens) == "one two three four"
    assert all(
        t.top_logprobs == []
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs
        for t in ch.choices[0].logprobs.content or []
    )


def test_completion_logprobs_stream_and_non_stream(served: Served) -> None:
    c = served.client()
    whole = c.completions.create(model="fake-model", prompt="SCRIPT:hello", logprobs=1)
    lp = whole.choices[0].logprobs
    assert lp is not None
    assert lp.tokens == list("hello") and lp.text_offset == [0, 1, 2, 3, 4]
    assert lp.token_logprobs == pytest.approx([-0.1] * 5)
    assert lp.top_logprobs is not None and lp.top_logprobs[0] == {"h": pytest.approx(-0.1)}
    chunks = list(
        c.completions.create(model="fake-model", prompt="SCRIPT:hello", logprobs=1, stream=True)
    )
    tokens, offsets = [], []
    for ch in chunks:
        if ch.choices and ch.choices[0].logprobs is not None:
            tokens += ch.choices[0].logprobs.tokens or []
            offsets += ch.choices[0].logprobs.text_offset or []
    assert tokens == lp.tokens and offsets == lp.text_offset
