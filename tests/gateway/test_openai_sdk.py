"""The gateway on a real uvicorn server, driven by the official openai SDK (responses parse as
the SDK's own types)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion import Completion

from tests.gateway.conftest import Served, serve
from tests.gateway.fake_engine import FakeEngine
from toolflash.gateway.config import GatewayConfig

READ_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    },
}
RUN_TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}


def hermes_call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def xml_call(name: str, args: dict) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def reassemble(chunks: list[ChatCompletionChunk]) -> dict:
    """Fold stream chunks into a message the way clients do."""
    content, reasoning, calls, finish = "", "", {}, None
    for ch in chunks:
        for choice in ch.choices:
            d = choice.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = call["id"] or tc.id
                if tc.function is not None:
                    call["name"] = call["name"] or tc.function.name
                    call["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return {
        "content": content,
        "reasoning": reasoning,
        "calls": [calls[i] for i in sorted(calls)],
        "finish": finish,
    }


def as_message(r: ChatCompletion) -> dict:
    m = r.choices[0].message
    return {
        "content": m.content or "",
        "reasoning": (m.model_extra or {}).get("reasoning_content") or "",
        "calls": [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in m.tool_calls or []
        ],
        "finish": r.choices[0].finish_reason,
    }


def strip_ids(m: dict) -> dict:
    return {**m, "calls": [{**c, "id": None} for c in m["calls"]]}


def test_plain_chat(served: Served) -> None:
    raw = served.client().chat.completions.with_raw_response.create(
        model="fake-model", messages=user("hi there")
    )
    assert raw.headers["x-toolflash-mode"] == "spec"
    r = raw.parse()
    assert isinstance(r, ChatCompletion)
    assert r.choices[0].message.content == "Hello! You said: hi there"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens == len("Hello! You said: hi there")
    assert r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    tf = r.model_extra["toolflash"]
    assert tf["sampling"]["method"] == "greedy" and tf["modes"] == ["spec"]
    assert tf["cycles"] > 0 and tf["tokens_per_cycle"] > 1
    assert tf["accepted"] == r.usage.completion_tokens - tf["cycles"]


def test_streaming_with_usage(served: Served) -> None:
    stream = served.client().chat.completions.create(
        model="fake-model",
        messages=user("stream please"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert "toolflash" in usage_chunk.model_extra
    msg = reassemble(chunks)
    assert msg["content"] == "Hello! You said: stream please" and msg["finish"] == "stop"
    assert usage_chunk.usage.completion_tokens == len(msg["content"])


def test_streaming_without_usage_puts_toolflash_on_finish_chunk(served: Served) -> None:
    chunks = list(
        served.client().chat.completions.create(model="fake-model", messages=user("x"), stream=True)
    )
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].model_extra["toolflash"]["request_class"].startswith("chat.")
    assert all(c.usage is None for c in chunks)


def _tools_roundtrip(served: Served, script: str, tools: list[dict]) -> tuple[dict, dict]:
    c = served.client()
    kw = {"model": "fake-model", "messages": user("SCRIPT:" + script), "tools": tools}
    whole = c.chat.completions.create(**kw)
    streamed = list(c.chat.completions.create(**kw, stream=True))
    return as_message(whole), reassemble(streamed)


def test_hermes_tool_calls_stream_equals_non_stream(served: Served) -> None:
    script = (
        "I'll read both.\n\n"
        + hermes_call("read_file", {"path": "src/a.py", "limit": 5})
        + "\n"
        + hermes_call("run", {"cmd": 'grep -n "x" b.py'})
    )
    whole, streamed = _tools_roundtrip(served, script, [READ_TOOL, RUN_TOOL])
    assert strip_ids(whole) == strip_ids(streamed)
    assert whole["finish"] == "tool_calls" and whole["content"] == "I'll read both."
    assert [c["name"] for c in whole["calls"]] == ["read_file", "run"]
    assert json.loads(whole["calls"][0]["arguments"]) == {"path": "src/a.py", "limit": 5}
    assert all(c["id"].startswith("call_") for c in whole["calls"] + streamed["calls"])


def test_xml_tool_calls_stream_equals_non_stream(served_xml: Served) -> None:
    script = xml_call("read_file", {"path": "a b.py", "limit": 3})
    whole, streamed = _tools_roundtrip(served_xml, script, [READ_TOOL])
    assert strip_ids(whole) == strip_ids(streamed)
    assert whole["finish"] == "tool_calls" and whole["content"] == ""
    assert json.loads(whole["calls"][0]["arguments"]) == {"path": "a b.py", "limit": 3}


def test_tool_arguments_stream_incrementally() -> None:
    # Cycles further apart than the stream interval: each goes out as it comes (a faster
    # engine's cycles would be written together, one write per interval).
    script = hermes_call("run", {"cmd": "echo " + "abcdefgh" * 8})
    with serve(FakeEngine(cycle_delay_s=0.003), GatewayConfig(stream_interval_ms=1)) as served:
        chunks = list(
            served.client().chat.completions.create(
                model="fake-model", messages=user("SCRIPT:" + script), tools=[RUN_TOOL], stream=True
            )
        )
    arg_chunks = [
        tc
        for c in chunks
        for ch in c.choices
        for tc in ch.delta.tool_calls or []
        if tc.function.arguments
    ]
    assert len(arg_chunks) > 5  # arguments arrive in many pieces, not one


def test_schema_check_reported(served: Served) -> None:
    r = served.client().chat.completions.create(
        model="fake-model",
        messages=user("SCRIPT:" + hermes_call("read_file", {"limit": "ten"})),
        tools=[READ_TOOL],
    )
    assert r.choices[0].finish_reason == "tool_calls"
    report = r.model_extra["toolflash"]["tool_calls"][0]
    assert report["parsed"] and report["schema_valid"] is False and report["schema_errors"]
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'result="schema_invalid"' in metrics and "toolflash:tool_calls_total" in metrics


def test_undeclared_tool_comes_back_as_text(served: Served) -> None:
    script = "Let me.\n" + hermes_call("rm_everything", {"p": "/"})
    whole, streamed = _tools_roundtrip(served, script, [READ_TOOL])
    assert whole == streamed
    assert whole["finish"] == "stop" and whole["calls"] == []
    assert "rm_everything" in whole["content"] and whole["content"].startswith("Let me.")
    r = served.client().chat.completions.create(
        model="fake-model", messages=user("SCRIPT:" + script), tools=[READ_TOOL]
    )
    assert r.model_extra["toolflash"]["rejected_tool_spans"][0]["reason"] == "undeclared_tool"


def test_call_cut_by_max_tokens_ends_with_length(served: Served) -> None:
    script = hermes_call("read_file", {"path": "a/very/long/path/name.py"})
    kw = {
        "model": "fake-model",
        "messages": user("SCRIPT:" + script),
        "tools": [READ_TOOL],
        "max_tokens": 50,
    }
    c = served.client()
    whole = as_message(c.chat.completions.create(**kw))
    streamed = reassemble(list(c.chat.completions.create(**kw, stream=True)))
    assert whole["finish"] == streamed["finish"] == "length"
    assert strip_ids(whole) == strip_ids(streamed)
    assert "<tool_call>" not in whole["content"]


def test_parallel_tool_calls_false_keeps_one_and_stops() -> None:
    script = (
        hermes_call("read_file", {"path": "a"}) + "\n" + hermes_call("read_file", {"path": "b"})
    )
    with serve(FakeEngine(cycle_delay_s=0.01)) as served:
        r = served.client().chat.completions.create(
            model="fake-model",
            messages=user("SCRIPT:" + script),
            tools=[READ_TOOL],
            parallel_tool_calls=False,
        )
        assert r.choices[0].finish_reason == "tool_calls"
        assert len(r.choices[0].message.tool_calls or []) == 1
        assert served.engine.finishes[-1] == "cancelled"  # generation stopped after the call
        assert r.usage is not None and r.usage.completion_tokens < len(script) - 30


def test_tool_choice_none_does_not_render_tools(served: Served) -> None:
    r = served.client().chat.completions.create(
        model="fake-model",
        messages=user("SCRIPT:" + hermes_call("read_file", {"path": "a"})),
        tools=[READ_TOOL],
        tool_choice="none",
    )
    assert served.engine.last_chat is not None and served.engine.last_chat[1] is None
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert (
        r.choices[0].message.content is not None and "<tool_call>" in r.choices[0].message.content
    )


def test_tool_result_turn(served: Served) -> None:
    messages = [
        {"role": "system", "content": "You are a coder."},
        {"role": "user", "content": "read a.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')"},
    ]
    r = served.client().chat.completions.create(
        model="fake-model", messages=messages, tools=[READ_TOOL]
    )
    assert r.choices[0].message.content == "Tool said: print('hi')"
    assert r.model_extra["toolflash"]["request_class"].startswith("tools.think-default.tool-result")
    rendered, tools, _ = served.engine.last_chat
    assert rendered[2]["tool_calls"][0]["function"]["arguments"] == {"path": "a.py"}
    assert rendered[3] == {"role": "tool", "content": "print('hi')", "tool_call_id": "call_1"}
    assert tools[0]["function"]["name"] == "read_file"


def test_reasoning_content(served_xml: Served) -> None:
    kw = {
        "model": "fake-model",
        "messages": user("SCRIPT:Let me think.\n</think>\n\nThe answer is 4."),
        "extra_body": {"chat_template_kwargs": {"enable_thinking": True}},
    }
    c = served_xml.client()
    r = c.chat.completions.create(**kw)
    assert r.model_extra["toolflash"]["request_class"].startswith("chat.think-on")
    whole = as_message(r)
    assert whole["reasoning"] == "Let me think." and whole["content"] == "The answer is 4."
    streamed = reassemble(list(c.chat.completions.create(**kw, stream=True)))
    assert streamed == whole
    assert served_xml.engine.last_chat[2] == {"enable_thinking": True}


def test_stop_strings_and_seed(served: Served) -> None:
    r = served.client().chat.completions.create(
        model="fake-model", messages=user("SCRIPT:one two STOP three"), stop=["STOP"], seed=7
    )
    assert r.choices[0].message.content == "one two " and r.choices[0].finish_reason == "stop"
    assert served.engine.last_request is not None
    assert served.engine.last_request.stop_strings == ("STOP",)
    assert served.engine.last_request.sampling.seed == 7


def test_sampling_fields_reach_the_engine_and_the_report(served: Served) -> None:
    r = served.client().chat.completions.create(
        model="fake-model",
        messages=user("hot"),
        temperature=0.9,
        top_p=0.5,
        seed=11,
        frequency_penalty=0.5,
        presence_penalty=-0.25,
        logit_bias={"104": 3.0, "7": -100},
        extra_body={"top_k": 40, "min_p": 0.05},
    )
    info = r.model_extra["toolflash"]["sampling"]
    assert info == {
        "method": "sample",
        "temperature": 0.9,
        "top_p": 0.5,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 11,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.25,
        "logit_bias_tokens": 2,
        "from_model_defaults": [],
    }
    sp = served.engine.last_request.sampling
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed) == (0.9, 0.5, 40, 0.05, 11)
    assert dict(sp.logit_bias) == {104: 3.0, 7: -100.0}
    assert "top_k" not in r.model_extra["toolflash"]["ignored_fields"]


def test_no_temperature_is_greedy_and_an_unseeded_sample_reports_its_seed(served: Served) -> None:
    c = served.client()
    r = c.chat.completions.create(model="fake-model", messages=user("cool"))
    assert r.model_extra["toolflash"]["sampling"]["method"] == "greedy"
    assert r.model_extra["toolflash"]["sampling"]["seed"] is None
    r = c.chat.completions.create(model="fake-model", messages=user("warm"), temperature=1.0)
    seed = r.model_extra["toolflash"]["sampling"]["seed"]
    assert isinstance(seed, int) and served.engine.last_request.sampling.seed == seed


def test_max_tokens_and_default_budget(served: Served) -> None:
    r = served.client().chat.completions.create(
        model="fake-model", messages=user("a long answer please"), max_completion_tokens=5
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    served.client().chat.completions.create(model="fake-model", messages=user("x"))
    req = served.engine.last_request
    assert req.max_tokens == served.engine.context_length - len(req.prompt_tokens)
    # Fits the context, not beside this prompt: clamped (agents send their configured limit).
    r = served.client().chat.completions.create(
        model="fake-model", messages=user("x"), max_tokens=served.engine.context_length - 1
    )
    assert r.model_extra["toolflash"]["max_tokens_clamped"] is True
    # No prompt could leave room for it: a 400, as OpenAI's.
    with pytest.raises(openai.BadRequestError) as e:
        served.client().chat.completions.create(
            model="fake-model", messages=user("x"), max_tokens=10**9
        )
    assert e.value.body["param"] == "max_tokens"


def test_unknown_fields_ignored_and_reported(served: Served) -> None:
    r = served.client().chat.completions.create(
        model="fake-model",
        messages=user("x"),
        extra_body={"reasoning_effort_custom": "high", "metadata_x": {"a": 1}},
    )
    assert set(r.model_extra["toolflash"]["ignored_fields"]) == {
        "reasoning_effort_custom",
        "metadata_x",
    }


def test_completions(served: Served) -> None:
    c = served.client()
    r = c.completions.create(model="fake-model", prompt="SCRIPT: world", max_tokens=20)
    assert isinstance(r, Completion)
    assert r.choices[0].text == " world" and r.choices[0].finish_reason == "stop"
    chunks = list(
        c.completions.create(
            model="fake-model",
            prompt="SCRIPT: streamed text",
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == " streamed text"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(
        " streamed text"
    )
    r = c.completions.create(model="fake-model", prompt=[[83, 67, 82, 73, 80, 84, 58, 104]])
    assert r.choices[0].text == "h"


def test_models(served: Served) -> None:
    models = served.client().models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    assert models.data[0].model_extra["context_length"] == 4096
    assert served.client().models.retrieve("fake-model").id == "fake-model"
    try:
        served.client().models.retrieve("org/other")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found"
    else:
        raise AssertionError("expected 404")


def test_health_status_metrics(served: Served) -> None:
    served.client().chat.completions.create(model="fake-model", messages=user("metrics"))
    assert httpx.get(f"{served.url}/health").json() == {"status": "ready"}
    status = httpx.get(f"{served.v1}/status").json()
    assert status["state"] == "ready" and status["queue"]["limit"] == 16
    last = status["recent"][0]
    assert last["outcome"] == "success" and last["mode"] == "spec" and last["tokens_per_cycle"] > 1
    assert len(status["recent"]) <= 32
    text = httpx.get(f"{served.url}/metrics").text
    for name in (
        "toolflash:spec_decode_num_drafts_total",
        "toolflash:spec_decode_num_draft_tokens_total",
        "toolflash:spec_decode_num_accepted_tokens_total",
        "toolflash:spec_decode_num_accepted_tokens_per_pos_total",
        "toolflash:time_to_first_token_seconds_bucket",
        "toolflash:time_per_output_token_seconds_bucket",
        "toolflash:e2e_request_latency_seconds_bucket",
        "toolflash:num_requests_waiting",
        "toolflash:process_resident_memory_bytes",
    ):
        assert name in text, name
    assert 'request_class="chat.think-default.user.lt1k"' in text
    assert 'position="0"' in text


def test_sdk_error_types(served: Served) -> None:
    c = served.client()
    try:
        c.chat.completions.create(model="nope", messages=user("x"))
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found"
    else:
        raise AssertionError("expected 404")
    try:
        c.chat.completions.create(model="fake-model", messages=user("x"), n=2)
    except openai.BadRequestError as e:
        assert "n > 1" in e.body["message"]
    else:
        raise AssertionError("expected 400")


def test_agent_round_trip_with_our_own_tool_calls(served: Served) -> None:
    """A response's tool call (and a cut one) goes back into the history as clients send it."""
    c = served.client()
    first = c.chat.completions.create(
        model="fake-model",
        messages=user("SCRIPT:" + hermes_call("read_file", {"path": "a.py"})),
        tools=[READ_TOOL],
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        {"role": "user", "content": "read a.py"},
        first.choices[0].message.model_dump(exclude_none=True, exclude={"reasoning_content"}),
        {"role": "tool", "tool_call_id": call.id, "content": "x = 1"},
    ]
    second = c.chat.completions.create(model="fake-model", messages=history, tools=[READ_TOOL])
    assert second.choices[0].message.content == "Tool said: x = 1"
    rendered = served.engine.last_chat[0]
    assert rendered[1]["tool_calls"][0] == {
        "id": call.id,
        "type": "function",
        "function": {"name": "read_file", "arguments": {"path": "a.py"}},
    }
    # A call that was cut by max_tokens has unparsable arguments: it is replayed as a string.
    history[1]["tool_calls"][0]["function"]["arguments"] = '{"path": "a.p'
    third = c.chat.completions.create(model="fake-model", messages=history, tools=[READ_TOOL])
    assert third.choices[0].finish_reason == "stop"
    assert (
        served.engine.last_chat[0][1]["tool_calls"][0]["function"]["arguments"] == '{"path": "a.p'
    )
