"""Fuzzing the gateway in-process (ASGI transport, one app whose lifespan runs for the module):
schemathesis cases from the app's own /openapi.json, and hypothesis bodies the schema cannot
express (template kwargs, lone surrogates, extreme numbers, token ids, nested JSON, raw bytes).
Every chat or completion body is also sent streamed.

Properties: never a 5xx; every error body in OpenAI's shape; a stream that started with 200
carries no error event and ends with `[DONE]`.

The default run is bounded for CI (a fake engine, small example counts). The long run,
`TOOLFLASH_FUZZ_LONG=1`, raises the counts and serves the embedded model (its context cut to
512 so a case's output stays short; `TOOLFLASH_FUZZ_ENGINE=fake` keeps the fake engine) and
writes its counts to `benchmarks/results/hardening.json` ("fuzz").
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from tests.gateway.fake_engine import FakeEngine  # noqa: E402
from toolflash import __version__  # noqa: E402
from toolflash.gateway.app import create_app  # noqa: E402
from toolflash.gateway.config import RESERVED_TEMPLATE_KWARGS, GatewayConfig  # noqa: E402
from toolflash.gateway.openapi import openapi_document  # noqa: E402

LONG = os.environ.get("TOOLFLASH_FUZZ_LONG") == "1"
REAL = LONG and os.environ.get("TOOLFLASH_FUZZ_ENGINE", "real") == "real"
SCHEMA_EXAMPLES = 500 if LONG else 25  # per operation and generation mode
CHAT_EXAMPLES = 420 if LONG else 60
COMPLETION_EXAMPLES = 200 if LONG else 30
RAW_EXAMPLES = 120 if LONG else 20
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "hardening.json"

# What the run saw, for the long run's figures.
COUNTS: Counter[str] = Counter()
STARTED = time.perf_counter()

schema = schemathesis.openapi.from_dict(openapi_document(__version__))
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
)


def _engine() -> Any:
    if not REAL:
        return FakeEngine(context_length=1024, vocab_size=4096)
    from toolflash.engine.factory import build_engine

    return build_engine(context_length=512)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    # Small outputs keep each case fast; a short context exercises the context checks too.
    engine = _engine()
    app = create_app(lambda: engine, GatewayConfig(default_max_tokens=8))
    with TestClient(app, raise_server_exceptions=False) as c:  # runs the lifespan once
        deadline = time.monotonic() + 120
        while c.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield c
    if LONG:
        _write_results()


def _write_results() -> None:
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data["fuzz"] = {
        "command": "TOOLFLASH_FUZZ_LONG=1 bash scripts/test.sh tests/gateway/test_fuzz.py",
        "engine": "embedded toolflash-tiny-qwen35 (context 512)" if REAL else "fake",
        "wall_s": round(time.perf_counter() - STARTED, 1),
        **dict(sorted(COUNTS.items())),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")


def check(response: Any, *, streamed: bool, kind: str, anthropic: bool = False) -> None:
    """The properties every answer must have (counted for the figures); `anthropic`: a
    /v1/messages route, whose errors and streams are in Anthropic's shape."""
    COUNTS[f"{kind}_calls"] += 1
    COUNTS[f"status_{response.status_code // 100}xx"] += 1
    if response.status_code >= 500:
        COUNTS["server_errors"] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if anthropic:
        check_anthropic(response, streamed)
        return
    if response.status_code >= 400:
        err = response.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and err["message"]
        COUNTS["errors_in_openai_shape"] += 1
        return
    if streamed and response.headers.get("content-type", "").startswith("text/event-stream"):
        COUNTS["streams_200"] += 1
        data = [ln[6:] for ln in response.text.split("\n") if ln.startswith("data: ")]
        assert data and data[-1] == "[DONE]", response.text[-300:]
        for event in data[:-1]:
            assert "error" not in json.loads(event), event


def check_anthropic(response: Any, streamed: bool) -> None:
    if response.status_code >= 400:
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        COUNTS["errors_in_anthropic_shape"] += 1
        return
    if streamed and response.headers.get("content-type", "").startswith("text/event-stream"):
        COUNTS["streams_200"] += 1
        kinds = [ln[7:] for ln in response.text.split("\n") if ln.startswith("event: ")]
        assert kinds and kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
        assert "error" not in kinds, response.text[-300:]


# ---------------------------------------------------------------- schema-driven


@schema.parametrize()
@settings(
    max_examples=SCHEMA_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_schema_cases(case: schemathesis.Case, client: TestClient) -> None:
    kw = case.as_transport_kwargs(base_url="http://testserver")
    response = client.request(**_httpx_kwargs(kw))
    anthropic = case.path.startswith("/v1/messages")
    check(response, streamed=False, kind="schema", anthropic=anthropic)
    body = kw.get("json")
    if case.method.upper() == "POST" and isinstance(body, dict):
        again = client.request(**_httpx_kwargs({**kw, "json": {**body, "stream": True}}))
        check(again, streamed=True, kind="schema", anthropic=anthropic)


def _httpx_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in kw.items() if k in ("method", "url", "headers", "params", "json")}
    if "data" in kw:
        out["content"] = kw["data"]
    return out


# ---------------------------------------------------------------- property-based bodies

_chars = st.characters(codec=None) | st.characters(categories=["Cs"])
TEXT = st.text(_chars, max_size=24) | st.sampled_from(["", " ", "<think>", "</tool_call>", "{%"])
NUMBER = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, 511, 512, 1023, 4095, 4096, 4105, 100_000, 999_999_999])
    | st.floats(allow_nan=True, allow_infinity=True)
)
SCALAR = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(
    SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=12
)
KWARG_KEYS = st.sampled_from(
    sorted(RESERVED_TEMPLATE_KWARGS) + ["enable_thinking", "reasoning_effort", "foo"]
)
SCHEMAS = (
    st.sampled_from(
        [
            {"type": "object"},
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
            {"$ref": "#/nowhere"},
            {"type": "string", "pattern": "("},
            {"type": "array", "items": {"type": "object", "properties": {"b": {}}}},
        ]
    )
    | JSON
)
TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function") | TEXT,
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["f", "g", "read_file"]) | TEXT},
            optional={"parameters": SCHEMAS, "strict": st.booleans(), "description": TEXT},
        ),
    }
)
CONTENT = TEXT | st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | TEXT,
        "content": CONTENT | JSON,
    },
    optional={
        "tool_call_id": TEXT,
        "reasoning_content": TEXT,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": TEXT,
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {"name": TEXT, "arguments": JSON.map(json.dumps) | TEXT}
                    ),
                }
            ),
            max_size=2,
        ),
    },
)
SAMPLING = {
    "temperature": NUMBER,
    "top_p": NUMBER,
    "top_k": NUMBER,
    "min_p": NUMBER,
    "seed": NUMBER,
    "frequency_penalty": NUMBER,
    "presence_penalty": NUMBER,
    "max_tokens": NUMBER,
    "logit_bias": st.dictionaries(st.integers(0, 2**40).map(str) | TEXT, NUMBER, max_size=3),
    "stop": TEXT | st.lists(TEXT, max_size=3),
    "n": NUMBER,
}
CHAT = st.fixed_dictionaries(
    {"messages": st.lists(MESSAGE, min_size=1, max_size=3)},
    optional={
        **SAMPLING,
        "max_completion_tokens": NUMBER,
        "logprobs": st.booleans() | SCALAR,
        "top_logprobs": NUMBER,
        "chat_template_kwargs": st.dictionaries(KWARG_KEYS | TEXT, JSON, max_size=3),
        "chat_template": TEXT,
        "tools": st.lists(TOOL, max_size=2),
        "tool_choice": st.sampled_from(["auto", "none", "required"])
        | st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": TEXT})}
        ),
        "parallel_tool_calls": st.booleans(),
        "response_format": st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "json_object", "json_schema"])},
            optional={
                "json_schema": st.fixed_dictionaries(
                    {"name": TEXT}, optional={"schema": SCHEMAS, "strict": st.booleans()}
                )
            },
        ),
        "model": st.just("fake-model") | TEXT,
    },
)
TOKEN_IDS = st.lists(
    st.integers(min_value=-5, max_value=2**70)
    | st.sampled_from([0, 4095, 4096, 4105, 100_000, 999_999_999]),
    min_size=0,
    max_size=6,
)
COMPLETION = st.fixed_dictionaries(
    {"prompt": TEXT | TOKEN_IDS | st.lists(TOKEN_IDS, max_size=2) | st.lists(TEXT, max_size=2)},
    optional={**SAMPLING, "logprobs": NUMBER, "echo": st.booleans(), "suffix": TEXT},
)


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


def send(client: TestClient, path: str, body: dict[str, Any]) -> None:
    """The body as sent (non-ASCII escaped, so lone surrogates travel as `\\udXXX`), then
    streamed."""
    for streamed in (False, True):
        raw = json.dumps({**body, "stream": streamed}, allow_nan=True).encode()
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
        check(r, streamed=streamed, kind="property", anthropic=path.startswith("/v1/messages"))


@fuzz(CHAT_EXAMPLES)
@given(body=CHAT)
def test_chat_bodies(client: TestClient, body: dict[str, Any]) -> None:
    send(client, "/v1/chat/completions", body)


@fuzz(COMPLETION_EXAMPLES)
@given(body=COMPLETION)
def test_completion_bodies(client: TestClient, body: dict[str, Any]) -> None:
    send(client, "/v1/completions", body)


BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": TEXT, "name": TEXT, "input": JSON}),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": TEXT},
        optional={
            "content": TEXT
            | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)
            | JSON,
            "is_error": st.booleans() | SCALAR,
        },
    ),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": TEXT}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["image", "document", "redacted_thinking"]) | TEXT}
    ),
)
ANTHROPIC_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system"]) | TEXT,
        "content": TEXT | st.lists(BLOCK, max_size=3) | JSON,
    }
)
MESSAGES = st.fixed_dictionaries(
    {"messages": st.lists(ANTHROPIC_MESSAGE, min_size=0, max_size=3), "max_tokens": NUMBER},
    optional={
        "model": st.just("fake-model") | TEXT,
        "system": TEXT
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)
        | JSON,
        "temperature": NUMBER,
        "top_p": NUMBER,
        "top_k": NUMBER,
        "stop_sequences": st.lists(TEXT, max_size=3) | JSON,
        "metadata": st.fixed_dictionaries({"user_id": TEXT | SCALAR}) | JSON,
        "tools": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["f", "read_file"]) | TEXT, "input_schema": SCHEMAS},
                optional={
                    "type": st.sampled_from(["custom", "bash_20250124"]) | TEXT,
                    "strict": st.booleans(),
                },
            ),
            max_size=2,
        ),
        "tool_choice": st.fixed_dictionaries(
            {"type": st.sampled_from(["auto", "any", "tool", "none"]) | TEXT},
            optional={"name": TEXT, "disable_parallel_tool_use": st.booleans() | SCALAR},
        ),
        "thinking": st.fixed_dictionaries(
            {"type": st.sampled_from(["enabled", "disabled", "adaptive"]) | TEXT},
            optional={"budget_tokens": NUMBER},
        ),
        "output_config": st.fixed_dictionaries(
            {"format": st.fixed_dictionaries({"type": st.just("json_schema"), "schema": SCHEMAS})}
        )
        | JSON,
    },
)


@fuzz(CHAT_EXAMPLES)
@given(body=MESSAGES, path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
def test_messages_bodies(client: TestClient, body: dict[str, Any], path: str) -> None:
    """Anthropic bodies: never a 5xx, errors in Anthropic's shape, streams end with message_stop."""
    send(client, path, body)


RAW = st.one_of(
    st.integers(1, 5000).map(lambda n: '{"messages": ' + "[" * n + "]" * n + "}"),
    st.integers(1, 3000).map(
        lambda n: (
            '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": '
            + '{"enable_thinking": ' * n
            + "1"
            + "}" * n
            + "}"
        )
    ),
    st.binary(max_size=64).map(lambda b: b'{"prompt": "' + b + b'"}'),
    st.sampled_from(
        ["", "null", "[]", "1e999", '"\\ud800"', '{"prompt": "\\ud800\\udc00\\ud800"}']
    ),
)


@fuzz(RAW_EXAMPLES)
@given(
    raw=RAW,
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/messages"]),
)
def test_raw_bodies(client: TestClient, raw: str | bytes, path: str) -> None:
    content = raw.encode() if isinstance(raw, str) else raw
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    check(r, streamed=False, kind="property", anthropic=path == "/v1/messages")
