"""POST /v1/responses on a real uvicorn server, driven by the official openai SDK's
`client.responses.create` (bodies and stream events parse as the SDK's own types)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.gateway.conftest import Served, serve
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_openai_sdk import hermes_call
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.openapi import openapi_document

READ = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
    "strict": False,
}
RUN = {
    "type": "function",
    "name": "run",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": False,
}


@pytest.fixture(scope="module")
def thinking() -> Iterator[Served]:
    with serve(FakeEngine(think_in_prompt=True)) as s:
        yield s


def create(s: Served, prompt: str | list[dict[str, Any]], **kw: Any) -> Response:
    return s.client().responses.create(model="fake-model", input=prompt, **kw)


def streamed(
    s: Served, prompt: str | list[dict[str, Any]], **kw: Any
) -> tuple[Response, list[Any]]:
    """The response of the stream's last event, and every event (SDK types) in order."""
    events = list(s.client().responses.create(model="fake-model", input=prompt, stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    return last.response, events


def items(r: Response) -> list[dict[str, Any]]:
    """Output items without their generated ids."""
    out = []
    for item in r.output:
        d = item.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("call_id", None)
        out.append(d)
    return out


def test_plain_text(served: Served) -> None:
    r = create(served, "hi there", metadata={"k": "v"}, temperature=0.5, top_p=0.9)
    assert isinstance(r, Response) and r.id.startswith("resp-") and r.model == "fake-model"
    assert r.status == "completed" and r.incomplete_details is None
    assert r.output_text == "Hello! You said: hi there"
    assert items(r) == [
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Hello! You said: hi there", "annotations": []}
            ],
        }
    ]
    assert r.usage is not None and r.usage.output_tokens == len("Hello! You said: hi there")
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens == 0
    assert r.metadata == {"k": "v"} and (r.temperature, r.top_p) == (0.5, 0.9)
    assert r.model_extra is not None and r.model_extra["store"] is False
    tf = r.model_extra["toolflash"]
    assert tf["request_id"] == r.id and tf["sampling"]["temperature"] == 0.5
    s = served.engine.last_request.sampling  # type: ignore[union-attr]
    assert (s.temperature, s.top_p) == (0.5, 0.9)
    assert served.engine.last_chat[0] == [{"role": "user", "content": "hi there"}]  # type: ignore[index]


def test_stream_sends_the_typed_sequence_and_equals_the_response(served: Served) -> None:
    whole = create(served, "SCRIPT:one two three", instructions="be brief")
    final, events = streamed(served, "SCRIPT:one two three", instructions="be brief")
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    body = {"model": "fake-model", "input": "SCRIPT:one two three", "instructions": "be brief"}
    body["stream"] = True
    wire = httpx.post(f"{served.v1}/responses", json=body).text
    frames = [f for f in wire.split("\n\n") if f.strip()]
    assert frames[-1] == "data: [DONE]"  # the Open Responses terminator, after typed events
    assert [f.split("\n", 1)[0] for f in frames[:-1]] == [f"event: {t}" for t in types]
    assert "".join(e.delta for e in events[4:-4]) == "one two three"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert items(final) == items(whole) and final.output_text == "one two three"
    assert final.usage == whole.usage and final.instructions == "be brief"
    assert (
        final.model_extra is not None and final.model_extra["toolflash"]["request_id"] == final.id
    )
    messages = served.engine.last_chat[0]  # type: ignore[index]
    assert messages[0] == {"role": "system", "content": "be brief"}


def test_function_call_round_trip(served: Served) -> None:
    call = hermes_call("read_file", {"path": "a.py"})
    r = create(served, "SCRIPT:Let me look." + call, tools=[READ])
    message, fc = r.output
    assert message.type == "message" and r.output_text == "Let me look."
    assert fc.type == "function_call" and fc.name == "read_file" and fc.status == "completed"
    assert json.loads(fc.arguments) == {"path": "a.py"} and fc.call_id.startswith("call_")
    final, events = streamed(served, "SCRIPT:Let me look." + call, tools=[READ])
    assert items(final) == items(r)
    args = [e for e in events if e.type.startswith("response.function_call_arguments")]
    assert [e.type for e in args][-1] == "response.function_call_arguments.done"
    assert "".join(e.delta for e in args[:-1]) == args[-1].arguments == fc.arguments
    # The output goes back as items, with a developer message and a reasoning item replayed.
    history: list[dict[str, Any]] = [
        {"role": "developer", "content": "dev rules"},
        {"role": "user", "content": [{"type": "input_text", "text": "read a.py"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        *[item.model_dump(exclude_none=True) for item in r.output],
        {"type": "function_call_output", "call_id": fc.call_id, "output": "print(1)"},
    ]
    back = create(served, history, tools=[READ], instructions="sys")
    assert back.output_text == "Tool said: print(1)"
    messages, tools, _ = served.engine.last_chat  # type: ignore[misc]
    assert messages == [
        {"role": "system", "content": "sys\n\ndev rules"},
        {"role": "user", "content": "read a.py"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "hm",
            "tool_calls": [
                {
                    "id": fc.call_id,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": {"path": "a.py"}},
                }
            ],
        },
        {"role": "tool", "content": "print(1)", "tool_call_id": fc.call_id},
    ]
    assert tools[0]["function"]["parameters"] == READ["parameters"]


def test_never_a_function_call_without_valid_arguments(served: Served) -> None:
    broken = '<tool_call>\n{"name": "read_file", "arguments": {"path": }\n</tool_call>'
    r = create(served, "SCRIPT:" + broken, tools=[READ])
    assert [i.type for i in r.output] == ["message"] and r.status == "completed"
    undeclared = create(served, "SCRIPT:" + hermes_call("rm", {"path": "/"}), tools=[READ])
    assert [i.type for i in undeclared.output] == ["message"]
    # Cut by max_output_tokens inside the call: the text so far, never half a function_call.
    call = hermes_call("read_file", {"path": "a_long_file_name.py"})
    cut = create(served, "SCRIPT:" + call, tools=[READ], max_output_tokens=20)
    assert [i.type for i in cut.output] == ["message"] and cut.status == "incomplete"
    final, events = streamed(served, "SCRIPT:" + call, tools=[READ], max_output_tokens=20)
    assert items(final) == items(cut)
    assert not any(e.type.startswith("response.function_call") for e in events)


def test_tool_choice_maps_to_the_constraint(served: Served) -> None:
    engine = served.engine
    r = create(
        served,
        "SCRIPT:" + hermes_call("run", {"cmd": "ls"}),
        tools=[READ, RUN],
        tool_choice={"type": "function", "name": "run"},
    )
    c = engine.last_request.constraint  # type: ignore[union-attr]
    assert c is not None and c.require_call and [t.name for t in c.tools] == ["run"]
    assert [i.type for i in r.output] == ["function_call"]
    assert r.model_extra is not None and r.model_extra["toolflash"]["request_class"].startswith(
        "tool"
    )
    create(served, "SCRIPT:x", tools=[READ, RUN], tool_choice="required", parallel_tool_calls=False)
    c = engine.last_request.constraint  # type: ignore[union-attr]
    assert c is not None and c.require_call and not c.parallel_calls and len(c.tools) == 2
    none = create(
        served, "SCRIPT:" + hermes_call("run", {"cmd": "ls"}), tools=[RUN], tool_choice="none"
    )
    assert engine.last_chat[1] is None  # type: ignore[index]  # no tools rendered
    assert [i.type for i in none.output] == ["message"]
    create(served, "SCRIPT:x", tools=[READ], tool_choice="auto")
    assert engine.last_request.constraint is None  # type: ignore[union-attr]
    # strict is the Responses API's default: the call is decoded under its schema.
    create(served, "SCRIPT:x", tools=[{k: v for k, v in READ.items() if k != "strict"}])
    c = engine.last_request.constraint  # type: ignore[union-attr]
    assert c is not None and not c.require_call and c.tools[0].strict


def test_namespace_tools_and_hosted_tools(served: Served) -> None:
    """Codex's shape: functions grouped in a namespace tool, and a hosted web_search it cannot
    run here (not offered, listed as ignored)."""
    agents = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "sub-agents",
        "tools": [{**RUN, "name": "close_agent"}],
    }
    tools = [READ, agents, {"type": "web_search", "external_web_access": False}]
    r = create(served, "SCRIPT:" + hermes_call("close_agent", {"cmd": "x"}), tools=tools)
    (fc,) = r.output
    assert fc.type == "function_call" and fc.name == "close_agent"
    assert fc.namespace == "multi_agent_v1"
    offered = served.engine.last_chat[1]  # type: ignore[index]
    assert [t["function"]["name"] for t in offered] == ["read_file", "close_agent"]
    assert "tools[2] (web_search)" in r.model_extra["toolflash"]["ignored_fields"]  # type: ignore[index]
    final, _ = streamed(served, "SCRIPT:" + hermes_call("close_agent", {"cmd": "x"}), tools=tools)
    assert items(final) == items(r)
    # The call goes back with its namespace; the template reads the plain call.
    back = create(
        served,
        [
            {"role": "user", "content": "close it"},
            fc.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": fc.call_id, "output": "closed"},
        ],
        tools=tools,
    )
    assert back.output_text == "Tool said: closed"
    assert back.model_extra["toolflash"]["ignored_fields"] == ["tools[2] (web_search)"]  # type: ignore[index]


def test_parallel_calls_stop_after_the_first_when_disabled(served: Served) -> None:
    two = hermes_call("run", {"cmd": "a"}) + hermes_call("run", {"cmd": "b"})
    both = create(served, "SCRIPT:" + two, tools=[RUN])
    one = create(served, "SCRIPT:" + two, tools=[RUN], parallel_tool_calls=False)
    assert [i.type for i in both.output] == ["function_call", "function_call"]
    assert [json.loads(i.arguments) for i in one.output] == [{"cmd": "a"}]  # type: ignore[union-attr]
    assert one.parallel_tool_calls is False


def test_json_schema_output(served: Served) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "place", "schema": schema, "strict": True}
    r = create(served, 'SCRIPT:{"city": "Oslo"}', text={"format": fmt, "verbosity": "low"})
    c = served.engine.last_request.constraint  # type: ignore[union-attr]
    assert c is not None and c.kind == "json" and c.schema == schema and c.strict
    assert json.loads(r.output_text) == {"city": "Oslo"}
    assert r.text is not None and r.text.format is not None and r.text.format.type == "json_schema"
    tf = r.model_extra["toolflash"]  # type: ignore[index]
    assert tf["structured_output"] == {"valid": True, "error": None}
    assert tf["ignored_fields"] == ["text.verbosity"]
    assert tf["request_class"].startswith("json")
    final, _ = streamed(served, 'SCRIPT:{"city": "Oslo"}', text={"format": fmt})
    assert items(final) == items(r)
    create(served, 'SCRIPT:{"a": 1}', text={"format": {"type": "json_object"}})
    c = served.engine.last_request.constraint  # type: ignore[union-attr]
    assert c is not None and c.kind == "json" and c.schema is None


def test_max_output_tokens_cut(served: Served) -> None:
    r = create(served, "a long answer please", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 5
    assert r.output[0].status == "incomplete" and r.max_output_tokens == 5
    final, events = streamed(served, "a long answer please", max_output_tokens=5)
    assert events[-1].type == "response.incomplete"
    assert events[-2].type == "response.output_item.done" and events[-2].item.status == "incomplete"
    assert items(final) == items(r) and final.incomplete_details == r.incomplete_details


def test_reasoning_items(thinking: Served) -> None:
    kw: dict[str, Any] = {"reasoning": {"effort": "high"}}
    r = create(thinking, "SCRIPT:weigh it</think>The answer.", **kw)
    assert thinking.engine.last_chat[2] == {"enable_thinking": True}  # type: ignore[index]
    assert items(r) == [
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "weigh it"}],
            "status": "completed",
        },
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "The answer.", "annotations": []}],
        },
    ]
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens == len("weigh it")
    assert r.reasoning is not None and r.reasoning.effort == "high"
    final, events = streamed(thinking, "SCRIPT:weigh it</think>The answer.", **kw)
    assert items(final) == items(r)
    types = [e.type for e in events]
    assert (
        types.count("response.output_item.added") == 2 == types.count("response.output_item.done")
    )
    assert "response.reasoning_text.delta" in types and "response.reasoning_text.done" in types
    create(thinking, "SCRIPT:x", reasoning={"effort": "none"})
    assert thinking.engine.last_chat[2] == {"enable_thinking": False}  # type: ignore[index]
    create(thinking, "SCRIPT:x")
    assert thinking.engine.last_chat[2] == {}  # type: ignore[index]


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({}, 400, "input", "input"),
        ({"input": "x", "model": "gpt-9"}, 404, None, "gpt-9"),
        ({"input": "x", "previous_response_id": "resp_1"}, 400, "previous_response_id", "store"),
        ({"input": "x", "conversation": "conv_1"}, 400, "conversation", "conversation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input", "item_reference"),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, 400, "input", "web_search_call"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            400,
            None,
            "input_image",
        ),
        ({"input": "x", "tools": [{"type": "custom", "name": "patch"}]}, 400, "tools", "custom"),
        (
            {"input": "x", "tools": [READ], "tool_choice": {"type": "function", "name": "nope"}},
            400,
            None,
            "nope",
        ),
        ({"input": "x", "tool_choice": "required"}, 400, "tool_choice", "needs tools"),
        ({"input": "x", "max_output_tokens": 10**9}, 400, "max_output_tokens", "context"),
        ({"input": "x", "temperature": 3}, 400, "temperature", "temperature"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, 400, None, "schema"),
        ({"input": "x", "include": ["file_search_call.results"]}, 400, "include[0]", "include"),
        ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata", "16"),
        (
            {"input": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "p"}]},
            400,
            "input",
            "prefill",
        ),
    ],
)
def test_error_shapes(
    served: Served, body: dict, status: int, param: str | None, words: str
) -> None:
    body = {"model": "fake-model", **body}
    with pytest.raises(openai.APIStatusError) as exc:
        served.client().post("/responses", body=body, cast_to=httpx.Response)
    assert exc.value.status_code == status
    err = _error(exc.value)
    assert words in err["message"]
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


def test_auth_and_route_errors_in_openai_shape() -> None:
    with serve(FakeEngine(), GatewayConfig(api_key="k3y")) as s:
        with pytest.raises(openai.AuthenticationError) as exc:
            s.client("wrong").responses.create(model="fake-model", input="x")
        assert _error(exc.value)["code"] == "invalid_api_key"
        assert s.client("k3y").responses.create(model="fake-model", input="x").output_text
        wrong = httpx.get(f"{s.v1}/responses", headers={"Authorization": "Bearer k3y"})
        assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


def test_an_engine_failure_mid_stream_is_an_error_then_failed() -> None:
    with serve(FakeEngine(fail_after_tokens=4)) as s:
        events = list(
            s.client().responses.create(model="fake-model", input="SCRIPT:abcdefgh", stream=True)
        )
        assert [e.type for e in events[-2:]] == ["error", "response.failed"]
        assert events[-2].code == "engine_error"
        assert events[-1].response.status == "failed" and events[-1].response.error is not None
        assert [e.sequence_number for e in events] == list(range(len(events)))
        with pytest.raises(openai.InternalServerError) as exc:
            s.client().responses.create(model="fake-model", input="SCRIPT:abcdefgh")
        assert _error(exc.value)["type"] == "server_error"


def test_same_greedy_output_as_chat_completions(served: Served) -> None:
    for text, tools in (
        ("SCRIPT:plain words", None),
        ("SCRIPT:" + hermes_call("run", {"cmd": "ls"}), [RUN]),
    ):
        r = create(served, text, instructions="sys", **({"tools": tools} if tools else {}))
        o = served.client().chat.completions.create(
            model="fake-model",
            messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": text}],
            **(
                {
                    "tools": [
                        {
                            "type": "function",
                            "function": {k: v for k, v in t.items() if k != "type"},
                        }
                        for t in tools
                    ]
                }
                if tools
                else {}
            ),
        )
        msg = o.choices[0].message
        assert r.output_text == (msg.content or "")
        assert [
            (i.name, json.loads(i.arguments)) for i in r.output if i.type == "function_call"
        ] == [
            (c.function.name, json.loads(c.function.arguments))  # type: ignore[union-attr]
            for c in msg.tool_calls or []
        ]
        assert r.usage is not None and o.usage is not None
        assert r.usage.input_tokens == o.usage.prompt_tokens
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'api="responses"' in metrics and 'api="chat"' in metrics


def test_openapi_covers_the_route() -> None:
    doc = openapi_document("0")
    post = doc["paths"]["/v1/responses"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body.endswith("/ResponsesRequest")
    assert "ResponseObject" in doc["components"]["schemas"]
    assert "text/event-stream" in post["responses"]["200"]["content"]
