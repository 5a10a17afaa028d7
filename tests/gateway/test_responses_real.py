"""POST /v1/responses around the embedded model (the engine `toolflash serve` starts with no
model named), driven by the openai SDK: greedy output is the chat-completions route's for the
same conversation, streamed equals complete, and a forced call parses under its schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.gateway.conftest import Served, serve

pytest.importorskip("mlx.core")

READ_PARAMS = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


@pytest.fixture(scope="module")
def embedded() -> Iterator[Served]:
    from toolflash.engine.factory import build_engine

    with serve(factory=lambda: build_engine()) as s:
        yield s


def model(s: Served) -> str:
    return str(httpx.get(f"{s.v1}/models").json()["data"][0]["id"])


def test_greedy_text_is_the_chat_routes_and_the_streams(embedded: Served) -> None:
    c, name = embedded.client(), model(embedded)
    kw: dict[str, Any] = {
        "model": name,
        "instructions": "You write Python.",
        "max_output_tokens": 24,
    }
    r = c.responses.create(input="def add(a, b):", **kw)
    events = list(c.responses.create(input="def add(a, b):", stream=True, **kw))
    o = c.chat.completions.create(
        model=name,
        max_tokens=24,
        messages=[
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "def add(a, b):"},
        ],
    )
    assert r.output_text and r.output_text == o.choices[0].message.content
    final = events[-1].response
    assert final.output_text == r.output_text
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text
    assert r.usage is not None and o.usage is not None
    assert r.usage.input_tokens == o.usage.prompt_tokens
    assert r.usage.output_tokens == o.usage.completion_tokens == final.usage.output_tokens
    expected = "incomplete" if o.choices[0].finish_reason == "length" else "completed"
    assert r.status == final.status == expected
    tf = r.model_extra["toolflash"]  # type: ignore[index]
    assert tf["sampling"]["method"] == "greedy" and tf["cycles"] > 0


def test_forced_call_round_trip_matches_the_chat_route(embedded: Served) -> None:
    c, name = embedded.client(), model(embedded)
    tool = {"type": "function", "name": "read_file", "parameters": READ_PARAMS, "strict": True}
    r = c.responses.create(
        model=name, input="read a.py", tools=[tool], tool_choice="required", max_output_tokens=64
    )
    calls = [i for i in r.output if i.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "read_file"
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, READ_PARAMS)
    o = c.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "read a.py"}],
        tools=[
            {
                "type": "function",
                "function": {"name": "read_file", "parameters": READ_PARAMS, "strict": True},
            }
        ],
        tool_choice="required",
        max_tokens=64,
    )
    chat_calls = o.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in chat_calls] == [  # type: ignore[union-attr]
        (i.name, json.loads(i.arguments)) for i in calls
    ]
    # The result goes back; the next turn is the chat route's next turn.
    history = [
        {"role": "user", "content": "read a.py"},
        *[i.model_dump(exclude_none=True) for i in r.output],
        *[
            {"type": "function_call_output", "call_id": i.call_id, "output": "print(1)"}
            for i in calls
        ],
    ]
    back = c.responses.create(model=name, input=history, tools=[tool], max_output_tokens=16)
    chat_back = c.chat.completions.create(
        model=name,
        messages=[
            {"role": "user", "content": "read a.py"},
            {
                "role": "assistant",
                "content": o.choices[0].message.content,
                "tool_calls": [
                    {
                        "id": i.call_id,
                        "type": "function",
                        "function": {"name": i.name, "arguments": i.arguments},
                    }
                    for i in calls
                ],
            },
            *[{"role": "tool", "tool_call_id": i.call_id, "content": "print(1)"} for i in calls],
        ],
        tools=[
            {
                "type": "function",
                "function": {"name": "read_file", "parameters": READ_PARAMS, "strict": True},
            }
        ],
        max_tokens=16,
    )
    assert back.usage is not None and chat_back.usage is not None
    assert back.usage.input_tokens == chat_back.usage.prompt_tokens
    assert back.output_text == (chat_back.choices[0].message.content or "")
