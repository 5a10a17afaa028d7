"""Bad input gets the right status in OpenAI's error shape, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.conftest import Served, serve
from tests.gateway.fake_engine import FakeEngine
from toolflash.gateway.config import GatewayConfig

OK = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
NOT_SCHEMA = {
    "name": "x",
    "strict": True,
    "schema": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
}


@pytest.fixture(scope="module")
def small() -> Iterator[Served]:
    config = GatewayConfig(max_body_bytes=4096)
    with serve(FakeEngine(context_length=256), config) as s:
        yield s


def post(s: Served, path: str, **kw: object) -> httpx.Response:
    return httpx.post(f"{s.url}{path}", timeout=10, **kw)  # type: ignore[arg-type]


def assert_error(r: httpx.Response, status: int, needle: str = "", code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and needle.lower() in err["message"].lower(), err
    if code is not None:
        assert err["code"] == code
    return err


CASES = [
    (
        "malformed_json",
        {"content": b'{"model": "fake-model", "messages": ['},
        400,
        "not valid JSON",
        None,
    ),
    ("not_an_object", {"json": [1, 2]}, 400, "must be a JSON object", None),
    ("empty_body", {"content": b""}, 400, "empty", None),
    ("messages_wrong_type", {"json": {"messages": "hi"}}, 400, "messages", None),
    ("empty_messages", {"json": {"messages": []}}, 400, "at least 1", None),
    ("missing_messages", {"json": {"model": "fake-model"}}, 400, "messages", None),
    (
        "unknown_role",
        {"json": {"messages": [{"role": "wizard", "content": "x"}]}},
        400,
        "wizard",
        None,
    ),
    (
        "tool_msg_without_id",
        {"json": {"messages": [{"role": "tool", "content": "x"}]}},
        400,
        "tool_call_id",
        None,
    ),
    ("max_tokens_zero", {"json": {**OK, "max_tokens": 0}}, 400, "max_tokens", None),
    ("temperature_type", {"json": {**OK, "temperature": "hot"}}, 400, "temperature", None),
    (
        "image_part",
        {"json": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}},
        400,
        "text only",
        None,
    ),
    ("unknown_model", {"json": {**OK, "model": "gpt-9"}}, 404, "gpt-9", "model_not_found"),
    (
        "invalid_tool_schema",
        {
            "json": {
                **OK,
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}
                ],
            }
        },
        400,
        "json schema",
        None,
    ),
    (
        "bad_tool_name",
        {"json": {**OK, "tools": [{"type": "function", "function": {"name": "a b"}}]}},
        400,
        "name",
        None,
    ),
    ("duplicate_tools", {"json": {**OK, "tools": [TOOL, TOOL]}}, 400, "unique", None),
    ("n_2", {"json": {**OK, "n": 2}}, 400, "n > 1", "unsupported_parameter"),
    ("top_logprobs_alone", {"json": {**OK, "top_logprobs": 2}}, 400, "requires logprobs", None),
    (
        "top_logprobs_range",
        {"json": {**OK, "logprobs": True, "top_logprobs": 21}},
        400,
        "top_logprobs",
        None,
    ),
    (
        "json_schema_unsupported_keyword",
        {"json": {**OK, "response_format": {"type": "json_schema", "json_schema": NOT_SCHEMA}}},
        400,
        'Unimplemented keys: ["not"]',
        None,
    ),
    (
        "json_schema_invalid",
        {
            "json": {
                **OK,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                },
            }
        },
        400,
        "not a valid JSON schema at type",
        None,
    ),
    (
        "json_schema_missing",
        {"json": {**OK, "response_format": {"type": "json_schema"}}},
        400,
        "needs a json_schema object",
        None,
    ),
    (
        "strict_tool_unsupported_keyword",
        {
            "json": {
                **OK,
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "strict": True,
                            "parameters": NOT_SCHEMA["schema"],
                        },
                    }
                ],
            }
        },
        400,
        "tool 'f'",
        None,
    ),
    (
        "json_and_forced_tool",
        {
            "json": {
                **OK,
                "tools": [TOOL],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            }
        },
        400,
        "cannot be combined",
        None,
    ),
    (
        "required_without_tools",
        {"json": {**OK, "tool_choice": "required"}},
        400,
        "needs tools",
        None,
    ),
    ("presence_penalty", {"json": {**OK, "presence_penalty": 2.5}}, 400, "presence_penalty", None),
    ("top_k", {"json": {**OK, "top_k": -2}}, 400, "top_k", None),
    ("min_p", {"json": {**OK, "min_p": 1.5}}, 400, "min_p", None),
    ("logit_bias_key", {"json": {**OK, "logit_bias": {"a": 1}}}, 400, "token ids", None),
    ("logit_bias_value", {"json": {**OK, "logit_bias": {"5": 101}}}, 400, "-100 and 100", None),
    (
        "logit_bias_out_of_vocab",
        {"json": {**OK, "logit_bias": {"99999999": 1}}},
        400,
        "outside the model's vocabulary",
        None,
    ),
    (
        "prompt_beyond_context",
        {"json": {**OK, "messages": [{"role": "user", "content": "x" * 400}]}},
        400,
        "maximum context length is 256",
        "context_length_exceeded",
    ),
    (
        "oversized_body",
        {"json": {**OK, "messages": [{"role": "user", "content": "x" * 5000}]}},
        413,
        "limit",
        None,
    ),
]


@pytest.mark.parametrize(
    ("kw", "status", "needle", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_chat_requests(
    small: Served, kw: dict, status: int, needle: str, code: str | None
) -> None:
    assert_error(post(small, "/v1/chat/completions", **kw), status, needle, code)
    # ...and the server keeps serving.
    assert post(small, "/v1/chat/completions", json=OK).status_code == 200


def test_context_error_names_the_limits(small: Served) -> None:
    # Fits by its characters (one per token here), not once the template wraps it.
    big = {**OK, "messages": [{"role": "user", "content": "x" * 240}]}
    err = assert_error(post(small, "/v1/chat/completions", json=big), 400)
    assert "256" in err["message"] and "prompt tokens" in err["message"]
    # Cannot fit by its characters alone: refused before the template or the tokenizer.
    small.engine.last_chat = None
    big = {**OK, "messages": [{"role": "user", "content": "x" * 400}]}
    err = assert_error(post(small, "/v1/chat/completions", json=big), 400, "400 characters")
    assert err["code"] == "context_length_exceeded" and small.engine.last_chat is None


def test_oversized_chunked_body(small: Served) -> None:
    def gen() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    assert_error(post(small, "/v1/chat/completions", content=gen()), 413)
    assert post(small, "/v1/chat/completions", json=OK).status_code == 200


def test_bad_completions(small: Served) -> None:
    assert_error(post(small, "/v1/completions", json={"prompt": 5}), 400, "prompt")
    assert_error(post(small, "/v1/completions", json={"prompt": ["a", "b"]}), 400, "batched")
    assert_error(post(small, "/v1/completions", json={"prompt": "a", "echo": True}), 400, "echo")
    assert_error(post(small, "/v1/completions", json={"prompt": ""}), 400, "empty")
    assert post(small, "/v1/completions", json={"prompt": "hello"}).status_code == 200


def test_unknown_route_and_method(small: Served) -> None:
    assert_error(httpx.get(f"{small.url}/v1/nothing"), 404, "no route", "not_found")
    assert_error(httpx.get(f"{small.url}/v1/chat/completions"), 405, "not allowed")


def test_engine_failure_before_and_after_stream_start() -> None:
    with serve(FakeEngine(fail_after_tokens=10)) as s:
        r = post(s, "/v1/chat/completions", json=OK)
        assert_error(r, 500, "engine error", "engine_error")
        with httpx.stream("POST", f"{s.v1}/chat/completions", json={**OK, "stream": True}) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert '"error"' in events[-2] and "scripted engine failure" in events[-2]
        # the worker survives engine failures
        s.engine.fail_after_tokens = None
        assert post(s, "/v1/chat/completions", json=OK).status_code == 200
