"""Issue #26's bad inputs, each a structured 400/413 in OpenAI's shape with `param` set, decided
before the tokenizer, the template or the engine see them; and the server keeps serving."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Served, serve
from tests.gateway.fake_engine import FakeEngine
from toolflash.gateway.chat_output import ChatOutput, ContentDelta, MessageFold
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.limits import check_json_tree, encodable

OK = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


class CountingEngine(FakeEngine):
    """Counts the prompts that reached the template or the tokenizer."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.rendered = 0
        self.encoded = 0

    def encode_chat(self, messages, tools=None, template_kwargs=None):  # type: ignore[no-untyped-def]
        self.rendered += 1
        return super().encode_chat(messages, tools, template_kwargs)

    def encode(self, text: str) -> list[int]:
        self.encoded += 1
        return super().encode(text)


@pytest.fixture(scope="module")
def s() -> Iterator[Served]:
    engine = CountingEngine(context_length=4096, vocab_size=4096)
    with serve(engine, GatewayConfig(max_body_bytes=1 << 20, default_max_tokens=8)) as served:
        yield served


def post(s: Served, path: str, **kw: Any) -> httpx.Response:
    return httpx.post(f"{s.url}{path}", timeout=20, **kw)


def refused(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param, err
    return err


def raw_json(text: str) -> dict[str, Any]:
    return {"content": text.encode(), "headers": {"content-type": "application/json"}}


CHAT_CASES: list[tuple[str, dict[str, Any], int, str | None]] = [
    (
        "surrogate_content",
        raw_json('{"messages": [{"role": "user", "content": "a\\ud800"}]}'),
        400,
        "messages[0].content",
    ),
    (
        "surrogate_key",
        raw_json('{"messages": [{"role": "user", "content": "a"}], "\\udfff": 1}'),
        400,
        "body",
    ),
    (
        "surrogate_tool",
        {"json": {**OK, "tools": [{**TOOL, "function": {"name": "f", "description": "\ud800"}}]}}
        if False
        else raw_json(
            '{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", '
            '"function": {"name": "f", "description": "\\ud83d"}}]}'
        ),
        400,
        "tools[0].function.description",
    ),
    ("deep_json", raw_json('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"), 400, None),
    (
        "deep_kwargs",
        raw_json(
            '{"messages": [{"role": "user", "content": "a"}], '
            '"chat_template_kwargs": {"x": ' + "[" * 70 + "]" * 70 + "}}"
        ),
        400,
        "chat_template_kwargs.x" + "[0]" * 62,
    ),
    (
        "reserved_kwarg",
        {"json": {**OK, "chat_template_kwargs": {"add_generation_prompt": False}}},
        400,
        "chat_template_kwargs.add_generation_prompt",
    ),
    (
        "reserved_tokenize",
        {"json": {**OK, "chat_template_kwargs": {"tokenize": True}}},
        400,
        "chat_template_kwargs.tokenize",
    ),
    (
        "client_template_kwarg",
        {
            "json": {
                **OK,
                "chat_template_kwargs": {
                    "chat_template": "{% for i in range(10**9) %}x{% endfor %}"
                },
            }
        },
        400,
        "chat_template_kwargs.chat_template",
    ),
    (
        "client_template_field",
        {"json": {**OK, "chat_template": "{{ 'x' * 10**9 }}"}},
        400,
        "chat_template",
    ),
    (
        "unknown_kwarg",
        {"json": {**OK, "chat_template_kwargs": {"foo": 1}}},
        400,
        "chat_template_kwargs.foo",
    ),
    (
        "kwarg_object",
        {"json": {**OK, "chat_template_kwargs": {"enable_thinking": {"a": 1}}}},
        400,
        "chat_template_kwargs.enable_thinking",
    ),
    (
        "kwarg_huge_string",
        {"json": {**OK, "chat_template_kwargs": {"reasoning_effort": "x" * 100_000}}},
        400,
        "chat_template_kwargs.reasoning_effort",
    ),
    ("max_tokens_1e9", {"json": {**OK, "max_tokens": 10**9}}, 400, "max_tokens"),
    (
        "max_completion_tokens_huge",
        {"json": {**OK, "max_completion_tokens": 2**70}},
        400,
        "max_completion_tokens",
    ),
    (
        "json_schema_without_schema",
        {"json": {**OK, "response_format": {"type": "json_schema"}}},
        400,
        "response_format.json_schema",
    ),
    (
        "json_schema_no_schema_key",
        {"json": {**OK, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "prompt_beyond_context_by_chars",
        {"json": {"messages": [{"role": "user", "content": "x" * 5000}]}},
        400,
        "messages",
    ),
    ("many_stop_strings", {"json": {**OK, "stop": ["x"] * 17}}, 400, "stop"),
    ("long_stop_string", {"json": {**OK, "stop": "x" * 2000}}, 400, "stop"),
    (
        "body_over_limit",
        {"json": {"messages": [{"role": "user", "content": "x" * (2 << 20)}]}},
        413,
        None,
    ),
]


@pytest.mark.parametrize(
    ("kw", "status", "param"), [c[1:] for c in CHAT_CASES], ids=[c[0] for c in CHAT_CASES]
)
def test_bad_chat_inputs_are_refused_before_the_template(
    s: Served, kw: dict[str, Any], status: int, param: str | None
) -> None:
    engine: CountingEngine = s.engine  # type: ignore[assignment]
    before = engine.rendered
    refused(post(s, "/v1/chat/completions", **kw), status, param)
    assert engine.rendered == before
    assert post(s, "/v1/chat/completions", json=OK).status_code == 200


COMPLETION_CASES: list[tuple[str, Any, str]] = [
    ("id_just_past_vocab", [1, 2, 4096], "prompt"),
    ("id_far_past_vocab", [100000], "prompt"),
    ("id_huge", [999999999], "prompt"),
    ("id_past_int64", [2**80], "prompt"),
    ("nested_ids", [[5, 4105]], "prompt"),
    ("surrogate_prompt", "a\ud800", "prompt"),
]


@pytest.mark.parametrize(
    ("prompt", "param"), [c[1:] for c in COMPLETION_CASES], ids=[c[0] for c in COMPLETION_CASES]
)
def test_bad_completion_prompts(s: Served, prompt: Any, param: str) -> None:
    if isinstance(prompt, str):
        body: dict[str, Any] = raw_json('{"prompt": "a\\ud800"}')
    else:
        body = {"json": {"prompt": prompt}}
    refused(post(s, "/v1/completions", **body), 400, param)
    assert post(s, "/v1/completions", json={"prompt": [1, 2, 4095]}).status_code == 200


def test_completion_text_beyond_context_is_not_tokenized(s: Served) -> None:
    engine: CountingEngine = s.engine  # type: ignore[assignment]
    before = engine.encoded
    refused(post(s, "/v1/completions", json={"prompt": "x" * 5000}), 400, "prompt")
    assert engine.encoded == before


def test_allowed_template_kwargs_pass(s: Served) -> None:
    body = {**OK, "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"}}
    assert post(s, "/v1/chat/completions", json=body).status_code == 200


def test_check_json_tree_is_iterative_and_names_the_path() -> None:
    deep: Any = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(Exception, match="nested more than 64"):
        check_json_tree({"a": deep}, 64)
    check_json_tree({"a": [[{"b": "ok é"}]]}, 64)
    assert not encodable("x\udc80") and encodable("é") and encodable("plain")


class SlowTemplate(FakeEngine):
    """A template that takes `delay` seconds for prompts that ask for it."""

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        if "SLOW" in str(messages[-1].get("content")):
            time.sleep(1.5)
        return super().encode_chat(messages, tools, template_kwargs)


def test_slow_template_is_refused_within_budget_and_does_not_hold_the_engine() -> None:
    config = GatewayConfig(render_timeout_s=0.3, render_threads=2)
    with serve(SlowTemplate(), config) as s:
        slow = {"messages": [{"role": "user", "content": "SLOW"}]}
        t0 = time.perf_counter()
        err = refused(post(s, "/v1/chat/completions", json=slow), 400, None)
        assert err["code"] == "prompt_too_slow" and time.perf_counter() - t0 < 1.2
        # While the next slow render runs, a normal request is served at once.
        threading.Thread(
            target=post, args=(s, "/v1/chat/completions"), kwargs={"json": slow}
        ).start()
        time.sleep(0.05)
        t0 = time.perf_counter()
        assert post(s, "/v1/chat/completions", json=OK).status_code == 200
        assert time.perf_counter() - t0 < 0.5


def test_a_cut_generation_never_returns_an_empty_message() -> None:
    """max_tokens inside the `<think>` glue or a forced call's opening: the text is content."""
    for text in ("<think>\n\n", "<think>\n\n</think>"):
        out = ChatOutput(parser=None, tools={}, start_in_reasoning=False)
        fold = MessageFold()
        fold.add(out.feed(text))
        fold.add(out.close())
        assert fold.message()["content"] == text
    out = ChatOutput(parser=None, tools={}, start_in_reasoning=False)
    assert out.feed("<think>\nplan</think>\n\nanswer") and not [
        d for d in out.close() if isinstance(d, ContentDelta)
    ]


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_a_forced_call_cut_by_max_tokens_comes_back_as_content(fmt: str) -> None:
    from toolflash.gateway.tool_parsers import get_parser

    tools = {"run": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
    if fmt == "hermes":
        whole = '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls -la"}}\n</tool_call>'
    else:
        whole = "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n</function>\n</tool_call>"
    cut = whole[: whole.index("ls") + 2]

    def message(text: str, hold: bool) -> dict[str, Any]:
        ids = iter(range(100))
        out = ChatOutput(
            parser=get_parser(fmt),
            tools=tools,
            start_in_reasoning=False,
            hold_calls=hold,
            id_factory=lambda: f"call_{next(ids)}",
        )
        fold = MessageFold()
        for i in range(0, len(text), 3):  # as a stream delivers it
            fold.add(out.feed(text[i : i + 3]))
        fold.add(out.close())
        return fold.message()

    held = message(cut, hold=True)
    assert held["content"] == cut and held["tool_calls"] is None
    assert message(cut, hold=False)["tool_calls"]  # unforced: the partial call, as before
    # A call that closes is the same call held or not.
    assert message(whole, hold=True) == message(whole, hold=False)
