"""POST /v1/messages and /v1/messages/count_tokens on a real uvicorn server, driven by the
official `anthropic` SDK (responses and stream events parse as the SDK's own types)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.gateway.conftest import Served, serve
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_openai_sdk import hermes_call, user
from toolflash.gateway.config import GatewayConfig

READ = {
    "name": "read_file",
    "description": "Read a file",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}
RUN = {"name": "run", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}


def client(s: Served, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=s.url, api_key=kw.pop("api_key", "none"), max_retries=0, timeout=20, **kw
    )


@pytest.fixture(scope="module")
def thinking() -> Iterator[Served]:
    with serve(FakeEngine(think_in_prompt=True)) as s:
        yield s


def say(s: Served, text: str, **kw: Any) -> anthropic.types.Message:
    kw.setdefault("max_tokens", 256)
    return client(s).messages.create(model="fake-model", messages=user(text), **kw)


def streamed(s: Served, text: str, **kw: Any) -> tuple[anthropic.types.Message, list[str]]:
    """The SDK's reassembled message, and the event types on the wire in order."""
    kw.setdefault("max_tokens", 256)
    with client(s).messages.stream(model="fake-model", messages=user(text), **kw) as stream:
        final = stream.get_final_message()
    body = {"model": "fake-model", "messages": user(text), "stream": True, **kw}
    with httpx.stream("POST", f"{s.url}/v1/messages", json=body, timeout=20) as r:
        wire = "".join(r.iter_text())
    types = []
    for event in wire.split("\n\n"):
        if event.strip():
            head, data = event.split("\n", 1)
            kind = head.removeprefix("event: ")
            assert json.loads(data.removeprefix("data: "))["type"] == kind
            types.append(kind)
    return final, types


def blocks(m: anthropic.types.Message) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True) for b in m.content]


def test_plain_text(served: Served) -> None:
    m = say(served, "hi there")
    assert m.type == "message" and m.role == "assistant" and m.model == "fake-model"
    assert blocks(m) == [{"type": "text", "text": "Hello! You said: hi there"}]
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens == len("Hello! You said: hi there")
    assert m.usage.input_tokens > 0 and m.usage.cache_read_input_tokens == 0
    tf = m.model_extra["toolflash"]  # type: ignore[index]
    assert tf["request_id"] == m.id and m.id.startswith("msg-")


def test_stream_sends_the_exact_event_sequence_and_equals_the_message(served: Served) -> None:
    whole = say(served, "SCRIPT:one two three")
    final, types = streamed(served, "SCRIPT:one two three")
    assert types[:3] == ["message_start", "ping", "content_block_start"]
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(types[3:-3]) == {"content_block_delta"}
    assert blocks(final) == blocks(whole) == [{"type": "text", "text": "one two three"}]
    assert final.stop_reason == whole.stop_reason == "end_turn"
    assert final.usage.model_dump() == whole.usage.model_dump()


def test_tool_use_round_trip(served: Served) -> None:
    call = hermes_call("read_file", {"path": "a.py"})
    m = say(served, "SCRIPT:Let me look." + call, tools=[READ])
    assert m.stop_reason == "tool_use"
    text, use = m.content
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.name == "read_file" and use.input == {"path": "a.py"}
    assert use.id.startswith("toolu_")
    final, _ = streamed(served, "SCRIPT:Let me look." + call, tools=[READ])
    assert [b.model_dump() | {"id": None} for b in final.content if b.type == "tool_use"] == [
        use.model_dump() | {"id": None}
    ]
    assert final.stop_reason == "tool_use"
    # The result goes back: several text blocks, flagged as an error.
    history = [
        {"role": "user", "content": "read a.py"},
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "is_error": True,
                    "content": [
                        {"type": "text", "text": "no such"},
                        {"type": "text", "text": "file"},
                    ],
                }
            ],
        },
    ]
    r = client(served).messages.create(
        model="fake-model", max_tokens=64, messages=history, tools=[READ]
    )
    assert r.content[0].text == "Tool said: Error: no such\nfile"  # type: ignore[union-attr]
    messages, tools, _ = served.engine.last_chat  # type: ignore[misc]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": {"path": "a.py"},
    }
    assert messages[2]["tool_call_id"] == use.id
    assert tools[0]["function"]["parameters"] == READ["input_schema"]


def test_never_tool_use_without_a_valid_tool_use_block(served: Served) -> None:
    broken = '<tool_call>\n{"name": "read_file", "arguments": {"path": }\n</tool_call>'
    m = say(served, "SCRIPT:" + broken, tools=[READ])
    assert m.stop_reason == "end_turn" and all(b.type == "text" for b in m.content)
    # Cut by max_tokens inside the call: the text so far, never half a tool_use block.
    call = hermes_call("read_file", {"path": "a_long_file_name.py"})
    cut = say(served, "SCRIPT:" + call, tools=[READ], max_tokens=20)
    assert cut.stop_reason == "max_tokens" and all(b.type == "text" for b in cut.content)
    final, _ = streamed(served, "SCRIPT:" + call, tools=[READ], max_tokens=20)
    assert blocks(final) == blocks(cut)


def test_tool_choice_maps_to_the_constraint(served: Served) -> None:
    engine = served.engine
    say(
        served,
        "SCRIPT:" + hermes_call("run", {"cmd": "ls"}),
        tools=[READ, RUN],
        tool_choice={"type": "tool", "name": "run"},
    )
    c = engine.last_request.constraint  # type: ignore[union-attr]
    assert c is not None and c.require_call and [t.name for t in c.tools] == ["run"]
    assert not c.parallel_calls
    say(
        served,
        "SCRIPT:x",
        tools=[READ, RUN],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    c = engine.last_request.constraint  # type: ignore[union-attr]
    assert c is not None and c.require_call and not c.parallel_calls and len(c.tools) == 2
    m = say(
        served,
        "SCRIPT:" + hermes_call("run", {"cmd": "ls"}),
        tools=[RUN],
        tool_choice={"type": "none"},
    )
    assert engine.last_chat[1] is None  # type: ignore[index]  # no tools rendered
    assert m.stop_reason == "end_turn" and m.content[0].type == "text"
    say(served, "SCRIPT:x", tools=[READ], tool_choice={"type": "auto"})
    assert engine.last_request.constraint is None  # type: ignore[union-attr]


def test_parallel_calls_stop_after_the_first_when_disabled(served: Served) -> None:
    two = hermes_call("run", {"cmd": "a"}) + hermes_call("run", {"cmd": "b"})
    both = say(served, "SCRIPT:" + two, tools=[RUN])
    one = say(
        served,
        "SCRIPT:" + two,
        tools=[RUN],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert [b.type for b in both.content] == ["tool_use", "tool_use"]
    assert [b.input for b in one.content] == [{"cmd": "a"}]  # type: ignore[union-attr]
    assert one.stop_reason == "tool_use"


def test_stop_sequences(served: Served) -> None:
    m = say(served, "SCRIPT:one two STOP three", stop_sequences=["never", "STOP"])
    assert blocks(m) == [{"type": "text", "text": "one two "}]
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    final, _ = streamed(served, "SCRIPT:one two STOP three", stop_sequences=["never", "STOP"])
    assert blocks(final) == blocks(m)
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "STOP"
    plain = say(served, "SCRIPT:one two", stop_sequences=["STOP"])
    assert plain.stop_reason == "end_turn" and plain.stop_sequence is None


def test_thinking_blocks(thinking: Served) -> None:
    kw: dict[str, Any] = {
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "max_tokens": 2048,
    }
    m = say(thinking, "SCRIPT:weigh it</think>The answer.", **kw)
    assert thinking.engine.last_chat[2] == {"enable_thinking": True}  # type: ignore[index]
    assert blocks(m) == [
        {"type": "thinking", "thinking": "weigh it", "signature": ""},
        {"type": "text", "text": "The answer."},
    ]
    final, types = streamed(thinking, "SCRIPT:weigh it</think>The answer.", **kw)
    assert blocks(final) == blocks(m)
    assert types.count("content_block_start") == 2 == types.count("content_block_stop")
    say(thinking, "SCRIPT:x", thinking={"type": "disabled"})
    assert thinking.engine.last_chat[2] == {"enable_thinking": False}  # type: ignore[index]
    # Replayed thinking reaches the template as the assistant's reasoning.
    client(thinking).messages.create(
        model="fake-model",
        max_tokens=32,
        messages=[
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "a"},
                ],
            },
            {"role": "user", "content": "more"},
        ],
    )
    assistant = thinking.engine.last_chat[0][1]  # type: ignore[index]
    assert assistant == {"role": "assistant", "content": "a", "reasoning_content": "hmm"}


def test_max_tokens_cut_and_sampling(served: Served) -> None:
    m = say(
        served,
        "a long answer please",
        max_tokens=5,
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 7},
        metadata={"user_id": "u1"},
    )
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 5
    s = served.engine.last_request.sampling  # type: ignore[union-attr]
    assert (s.temperature, s.top_p, s.top_k) == (0.5, 0.9, 7)
    assert m.model_extra["toolflash"]["ignored_fields"] == []  # type: ignore[index]
    final, _ = streamed(served, "a long answer please", max_tokens=5)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5


def _error(exc: anthropic.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


@pytest.mark.parametrize(
    ("body", "status", "kind", "words"),
    [
        ({"messages": user("x")}, 400, "invalid_request_error", "max_tokens"),
        ({"max_tokens": 8}, 400, "invalid_request_error", "messages"),
        (
            {"max_tokens": 8, "messages": user("x"), "model": "gpt-9"},
            404,
            "not_found_error",
            "gpt-9",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}],
                    }
                ],
            },
            400,
            "invalid_request_error",
            "image",
        ),
        (
            {
                "max_tokens": 8,
                "messages": user("x"),
                "tools": [
                    {
                        "type": "web_search_20250305",
                        "name": "web_search",
                        "input_schema": {"type": "object"},
                    }
                ],
            },
            400,
            "invalid_request_error",
            "server tool",
        ),
        (
            {
                "max_tokens": 8,
                "messages": user("x"),
                "tools": [READ],
                "tool_choice": {"type": "tool", "name": "nope"},
            },
            400,
            "invalid_request_error",
            "nope",
        ),
        (
            {
                "max_tokens": 1024,
                "messages": user("x"),
                "thinking": {"type": "enabled", "budget_tokens": 2048},
            },
            400,
            "invalid_request_error",
            "budget_tokens",
        ),
        (
            {"max_tokens": 8, "messages": [*user("x"), {"role": "assistant", "content": "pre"}]},
            400,
            "invalid_request_error",
            "prefill",
        ),
        ({"max_tokens": 10**9, "messages": user("x")}, 400, "invalid_request_error", "context"),
        (
            {"max_tokens": 8, "messages": user("x"), "temperature": 1.5},
            400,
            "invalid_request_error",
            "temperature",
        ),
    ],
)
def test_error_shapes(served: Served, body: dict, status: int, kind: str, words: str) -> None:
    body = {"model": "fake-model", **body}
    with pytest.raises(anthropic.APIStatusError) as exc:
        client(served).post("/v1/messages", body=body, cast_to=httpx.Response)
    assert exc.value.status_code == status
    err = _error(exc.value)
    assert err["type"] == kind and words in err["message"]


def test_route_errors_and_auth_in_anthropic_shape() -> None:
    with serve(FakeEngine(), GatewayConfig(api_key="k3y")) as s:
        with pytest.raises(anthropic.AuthenticationError) as exc:
            client(s, api_key="wrong").messages.create(
                model="fake-model", max_tokens=8, messages=user("x")
            )
        assert _error(exc.value)["type"] == "authentication_error"
        ok = client(s, api_key="k3y").messages.create(
            model="fake-model", max_tokens=8, messages=user("x")
        )
        assert ok.content  # x-api-key accepted
        bearer = httpx.post(
            f"{s.url}/v1/messages",
            headers={"Authorization": "Bearer k3y"},
            json={"model": "fake-model", "max_tokens": 8, "messages": user("x")},
        )
        assert bearer.status_code == 200
        wrong = httpx.get(f"{s.url}/v1/messages", headers={"x-api-key": "k3y"})
        assert wrong.status_code == 405 and wrong.json()["type"] == "error"


def test_an_engine_failure_mid_stream_is_an_error_event() -> None:
    with serve(FakeEngine(fail_after_tokens=4)) as s:
        with httpx.stream(
            "POST",
            f"{s.url}/v1/messages",
            json={
                "model": "fake-model",
                "max_tokens": 64,
                "messages": user("SCRIPT:abcdefgh"),
                "stream": True,
            },
        ) as r:
            text = "".join(r.iter_text())
        assert r.status_code == 200
        assert "event: error\ndata: " in text and '"type": "api_error"' in text
        assert "message_stop" not in text
        with pytest.raises(anthropic.InternalServerError) as exc:
            client(s).messages.create(
                model="fake-model", max_tokens=64, messages=user("SCRIPT:abcdefgh")
            )
        assert _error(exc.value)["type"] == "api_error"


def test_count_tokens_matches_the_prompt(served: Served) -> None:
    c = client(served)
    kw: dict[str, Any] = {
        "model": "fake-model",
        "messages": user("count me"),
        "tools": [READ],
        "system": [{"type": "text", "text": "be brief"}],
    }
    n = c.messages.count_tokens(**kw)
    m = c.messages.create(max_tokens=8, **kw)
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0
    with pytest.raises(anthropic.BadRequestError) as exc:
        c.post("/v1/messages/count_tokens", body={"model": "fake-model"}, cast_to=httpx.Response)
    assert _error(exc.value)["type"] == "invalid_request_error"


def test_same_greedy_output_as_chat_completions(served: Served) -> None:
    for text, tools in (
        ("SCRIPT:plain words", None),
        ("SCRIPT:" + hermes_call("run", {"cmd": "ls"}), [RUN]),
    ):
        a = client(served).messages.create(
            model="fake-model",
            max_tokens=200,
            system="sys",
            messages=user(text),
            **({"tools": tools} if tools else {}),
        )
        o = served.client().chat.completions.create(
            model="fake-model",
            max_tokens=200,
            messages=[{"role": "system", "content": "sys"}, *user(text)],
            **(
                {
                    "tools": [
                        {
                            "type": "function",
                            "function": {"name": t["name"], "parameters": t["input_schema"]},
                        }
                        for t in tools
                    ]
                }
                if tools
                else {}
            ),
        )
        msg = o.choices[0].message
        assert "".join(b.text for b in a.content if b.type == "text") == (msg.content or "")
        assert [(b.name, b.input) for b in a.content if b.type == "tool_use"] == [
            (c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []
        ]
        assert a.usage.input_tokens == o.usage.prompt_tokens  # type: ignore[union-attr]
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'api="messages"' in metrics and 'api="chat"' in metrics


def test_a_mid_conversation_system_turn_stays_where_it_stands(served: Served) -> None:
    """Claude Code sends `system` turns inside `messages` (its mid-conversation-system beta)."""
    body = {
        "model": "fake-model",
        "max_tokens": 32,
        "system": "top",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "system", "content": [{"type": "text", "text": "agents: a, b"}]},
            {"role": "user", "content": "go"},
        ],
    }
    r = httpx.post(f"{served.url}/v1/messages", json=body, timeout=20)
    assert r.status_code == 200, r.text
    messages = served.engine.last_chat[0]  # type: ignore[index]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("system", "top"),
        ("user", "q"),
        ("system", "agents: a, b"),
        ("user", "go"),
    ]
    bad = {
        **body,
        "messages": [{"role": "system", "content": [{"type": "tool_result", "tool_use_id": "x"}]}],
    }
    r = httpx.post(f"{served.url}/v1/messages", json=bad, timeout=20)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
