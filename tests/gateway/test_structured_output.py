"""Structured output through the OpenAI SDK: response_format JSON schemas and forced tool calls
on the shipped tiny pair (real grammar masks), and the final JSON check on the fake engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import Served, serve
from tests.gateway.fake_engine import FakeEngine

pytest.importorskip("mlx.core")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "dev", "guest"]},
        "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_code",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def tiny() -> Iterator[Served]:
    from toolflash.engine.factory import build_engine

    with serve(factory=lambda: build_engine("toolflash-tiny-qwen3")) as s:
        yield s


def _model(s: Served) -> str:
    return s.client().models.list().data[0].id


def _json_format(strict: bool = True) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": "user", "schema": SCHEMA, "strict": strict},
    }


def test_json_schema_answer_validates_stream_and_not(tiny: Served) -> None:
    c = tiny.client()
    kw: dict[str, Any] = {
        "model": _model(tiny),
        "messages": [{"role": "user", "content": "Give me a JSON object describing a user."}],
        "max_tokens": 200,
        "response_format": _json_format(),
        "extra_body": NO_THINK,
    }
    whole = c.chat.completions.create(**kw)
    content = whole.choices[0].message.content or ""
    jsonschema.validate(json.loads(content), SCHEMA)
    assert whole.choices[0].finish_reason == "stop"
    tf = whole.model_extra["toolflash"]  # type: ignore[index]
    assert tf["structured_output"] == {"valid": True, "error": None}
    assert tf["request_class"].startswith("json.")
    _check_constraint(tf)
    chunks = list(c.chat.completions.create(**kw, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == content
    streamed = chunks[-1].model_extra["toolflash"]  # type: ignore[index]
    _check_constraint(streamed)
    # Greedy: the same tokens, so the same grammar work up to the drafts the policy ran.
    assert streamed["constraint"]["forced_tokens"] + streamed["constraint"]["mask_rows"] > 0


def _check_constraint(tf: dict[str, Any]) -> None:
    """The `toolflash.constraint` figures of a constrained response are present and coherent."""
    c = tf["constraint"]
    assert c is not None
    assert c["mask_rows"] >= 1 and c["mask_s"] > 0
    assert 0 <= c["grammar_rejected"] <= c["drafted_checked"]
    assert c["grammar_cuts"] <= c["drafted_checked"]
    assert c["forced_tokens"] >= c["forced_runs"] >= 0
    if tf["spec_cycles"] == 0:  # AR only: nothing drafted, one mask row per step at most
        assert c["drafted_checked"] == 0


def test_constraint_figures_reach_metrics(tiny: Served) -> None:
    c = tiny.client()
    r = c.chat.completions.create(
        model=_model(tiny),
        messages=[{"role": "user", "content": "What's the weather in Oslo?"}],
        tools=[SEARCH, WEATHER],
        tool_choice="required",
        max_tokens=120,
        extra_body=NO_THINK,
    )
    tf = r.model_extra["toolflash"]  # type: ignore[index]
    _check_constraint(tf)
    assert tf["constraint"]["forced_runs"] >= 1  # `<tool_call>` and `{"name": "` are forced
    plain = c.chat.completions.create(
        model=_model(tiny), messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert plain.model_extra["toolflash"]["constraint"] is None  # type: ignore[index]
    text = httpx.get(f"{tiny.url}/metrics").text
    want = {"model": _model(tiny), "request_class": tf["request_class"], "mode": tf["mode"]}
    values: dict[str, float] = {}
    classes: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("toolflash:constraint_"):
                classes.add(sample.labels["request_class"])
                if sample.labels == want:
                    values[sample.name] = sample.value
    c = tf["constraint"]
    assert values["toolflash:constraint_forced_runs_total"] >= c["forced_runs"]
    assert values["toolflash:constraint_forced_tokens_total"] >= c["forced_tokens"]
    assert values["toolflash:constraint_mask_rows_total"] >= c["mask_rows"]
    for name in ("mask_seconds", "drafted_tokens", "rejected_tokens", "cuts"):
        assert f"toolflash:constraint_{name}_total" in values
    assert not any(k.startswith("chat.") for k in classes)  # unconstrained: no series


def test_json_object_with_thinking_left_on(tiny: Served) -> None:
    r = tiny.client().chat.completions.create(
        model=_model(tiny),
        messages=[{"role": "user", "content": "Describe a user as JSON."}],
        max_tokens=200,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def _stream_calls(chunks: list[Any]) -> list[dict[str, Any]]:
    calls: dict[int, dict[str, Any]] = {}
    for ch in chunks:
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or tc.id
            call["name"] = call["name"] or tc.function.name
            call["arguments"] += tc.function.arguments or ""
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_forced_tool_call_non_stream_and_stream(tiny: Served, choice: Any) -> None:
    c = tiny.client()
    kw: dict[str, Any] = {
        "model": _model(tiny),
        "messages": [{"role": "user", "content": "Find where the retry logic is implemented."}],
        "tools": [SEARCH, WEATHER],
        "tool_choice": choice,
        "max_tokens": 200,
        "parallel_tool_calls": False,
        "extra_body": NO_THINK,
    }
    whole = c.chat.completions.create(**kw)
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (SEARCH, WEATHER)}
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    assert whole.model_extra["toolflash"]["request_class"].startswith("tool-forced.")  # type: ignore[index]

    chunks = list(c.chat.completions.create(**kw, stream=True))
    streamed = _stream_calls(chunks)
    assert [(s["name"], json.loads(s["arguments"])) for s in streamed] == [
        (call.function.name, json.loads(call.function.arguments))
    ]
    assert streamed[0]["id"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "choice",
    [{"type": "any"}, {"type": "tool", "name": "get_weather"}],
    ids=["any", "tool"],
)
def test_forced_tool_use_on_the_messages_route(tiny: Served, choice: dict[str, Any]) -> None:
    """The Anthropic route forces the same grammar-constrained call as chat completions: a
    tool_use block whose input validates, stop_reason tool_use, streamed equal to not, and the
    same call the chat route makes for the same conversation."""
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=tiny.url, api_key="none", max_retries=0, timeout=60)
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
        for t in (SEARCH, WEATHER)
    ]
    kw: dict[str, Any] = {
        "model": _model(tiny),
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "Find where the retry logic is implemented."}],
        "tools": tools,
        "tool_choice": {**choice, "disable_parallel_tool_use": True},
        "thinking": {"type": "disabled"},
    }
    m = c.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1
    if choice["type"] == "tool":
        assert uses[0].name == "get_weather"
    schemas = {t["name"]: t["input_schema"] for t in tools}
    jsonschema.validate(uses[0].input, schemas[uses[0].name])
    with c.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (uses[0].name, uses[0].input)
    ]
    named = {"type": "function", "function": {"name": "get_weather"}}
    chat = tiny.client().chat.completions.create(
        model=_model(tiny),
        max_tokens=200,
        messages=kw["messages"],
        tools=[SEARCH, WEATHER],
        tool_choice=named if choice["type"] == "tool" else "required",
        parallel_tool_calls=False,
        extra_body=NO_THINK,
    )
    call = chat.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        uses[0].name,
        uses[0].input,
    )


def test_strict_tool_with_auto_is_its_own_class(tiny: Served) -> None:
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    r = tiny.client().chat.completions.create(
        model=_model(tiny),
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[strict, SEARCH],
        max_tokens=120,
        extra_body=NO_THINK,
    )
    tf = r.model_extra["toolflash"]  # type: ignore[index]
    assert tf["request_class"].startswith("tools-strict.")
    for report in tf["tool_calls"]:
        if report["name"] == "get_weather":
            assert report["parsed"] and report["schema_valid"]


# -- the final check, on an engine that ignores constraints -------------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[Served]:
    with serve(FakeEngine()) as s:
        yield s


def _chat(s: Served, script: str, **kw: Any) -> Any:
    import httpx

    body = {"model": "fake-model", "messages": [{"role": "user", "content": f"SCRIPT:{script}"}]}
    return httpx.post(f"{s.v1}/chat/completions", json={**body, **kw}, timeout=20)


def test_final_check_reports_a_length_cut(fake: Served) -> None:
    r = _chat(fake, '{"name": "Ann", "age": 3', response_format=_json_format(), max_tokens=5)
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["toolflash"]["structured_output"]["valid"] is False


def test_final_check_refuses_an_invalid_strict_answer(fake: Served) -> None:
    r = _chat(fake, '{"name": "Ann"}', response_format=_json_format())
    assert r.status_code == 500
    assert "final JSON check" in r.json()["error"]["message"]
    assert "age" in r.json()["error"]["message"]
    # non-strict: returned as generated, reported invalid
    r = _chat(fake, '{"name": "Ann"}', response_format=_json_format(strict=False))
    assert r.status_code == 200 and r.json()["toolflash"]["structured_output"]["valid"] is False
    ok = '{"name": "Ann", "age": 3, "role": "dev"}'
    r = _chat(fake, ok, response_format=_json_format())
    assert r.json()["toolflash"]["structured_output"] == {"valid": True, "error": None}


def test_final_check_failure_after_stream_start_is_an_error_event(fake: Served) -> None:
    r = _chat(fake, '{"name": "Ann"}', response_format=_json_format(), stream=True)
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "final JSON check" in json.loads(events[-2])["error"]["message"]
