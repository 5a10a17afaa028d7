"""The shared request path's seams: the neutral request a dialect builds, the one event reader,
the one per-request record, and a new dialect plugged in without copying the path."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from tests.gateway.conftest import serve
from tests.gateway.fake_engine import FakeEngine
from toolflash.engine.api import FinishEvent, GenerationStats, TokenEvent, TokenLogprob
from toolflash.gateway.app import api_route
from toolflash.gateway.chat_output import ContentDelta
from toolflash.gateway.dialects.openai_request import chat_request, completion_request
from toolflash.gateway.errors import BadRequest, GatewayError
from toolflash.gateway.handler import Parsed, handle
from toolflash.gateway.protocol import ChatCompletionRequest, CompletionRequest, Timings
from toolflash.gateway.reader import (
    Collected,
    EventReader,
    TextOutput,
    collect,
    finish_reason,
    matched_stop,
)
from toolflash.gateway.record import RequestRecord, log_fields, status_row
from toolflash.gateway.request import ApiRequest, Conversation, ToolChoice
from toolflash.gateway.run import RequestRun
from toolflash.gateway.serving import GatewayContext
from toolflash.gateway.worker import Job, Prepared

TOOL = {
    "type": "function",
    "function": {
        "name": "read",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


# -- the neutral request ----------------------------------------------------------------------
def test_a_chat_body_becomes_one_neutral_request() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "read", "arguments": '{"path": "a"}'}}
                    ],
                },
                {"role": "tool", "content": "body", "tool_call_id": "c1"},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "read"}},
            "parallel_tool_calls": False,
            "stop": "END",
            "max_completion_tokens": 7,
            "temperature": 0.5,
            "logprobs": True,
            "top_logprobs": 2,
        }
    )
    api = chat_request(req)
    conv = api.conversation
    assert conv is not None
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "tool"]
    assert conv.messages[2]["tool_calls"][0]["function"]["arguments"] == {"path": "a"}
    assert conv.tool_choice == ToolChoice("named", "read")
    assert conv.parallel_tool_calls is False and conv.last_role == "tool"
    assert conv.offered_tools == [TOOL]
    assert conv.verbatim_chars == len("be brief") + len("hi") + len("body")
    assert (api.stop, api.max_tokens, api.logprobs) == (("END",), 7, 2)
    assert api.sampling.temperature == 0.5 and api.sampling.top_p is None


def test_tool_choice_none_renders_no_tools_and_raw_prompts_carry_ids() -> None:
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL], "tool_choice": "none"}
    )
    assert chat_request(req).conversation.offered_tools is None  # type: ignore[union-attr]
    ids = completion_request(CompletionRequest.model_validate({"prompt": [[1, 2, 3]]}))
    assert ids.conversation is None and ids.prompt.token_ids == (1, 2, 3)  # type: ignore[union-attr]


def test_a_json_schema_without_its_schema_is_a_400_naming_it() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n"}},
        }
    )
    with pytest.raises(BadRequest) as err:
        chat_request(req)
    assert err.value.param == "response_format.json_schema.schema"


# -- the reader -------------------------------------------------------------------------------
def test_matched_stop_names_the_stop_string_that_ended_the_text() -> None:
    assert matched_stop("one two STOP three", 8, ("STOP", "three")) == "STOP"
    assert matched_stop("abcXYZ", 3, ("Z", "XY")) == "XY"  # the earliest from the cut
    assert matched_stop("plain end", 9, ("STOP",)) is None  # EOS, not a stop string
    assert finish_reason("length", 2) == "length"
    assert finish_reason("stop", 1) == "tool_calls" and finish_reason("cancelled", 0) == "stop"


def _lp(i: int) -> TokenLogprob:
    return TokenLogprob(i, chr(i), -0.5)


def test_the_reader_hands_out_deltas_logprobs_and_the_ending() -> None:
    async def main() -> Collected:
        job = Job("j", lambda e: Prepared(None, None))  # type: ignore[arg-type]
        job.push("prepared", None)
        await job.wait_prepared()
        # A token whose text is held back: its log-probability waits for the next delta.
        job.push("event", TokenEvent((65,), "", None, (_lp(65),)))
        job.push("event", TokenEvent((66, 83), "AB", None, (_lp(66), _lp(83))))
        stats = GenerationStats(4, 0, 3, 0.0, 0.1, ())
        job.push("event", FinishEvent("stop", stats))
        reader = EventReader(job, TextOutput(), stops=("S",), decode=lambda ids: "ABS")
        return await collect(reader)

    got = asyncio.run(main())
    assert got.deltas == [ContentDelta("AB")]
    assert [t.token_id for t in got.logprobs] == [65, 66, 83]
    assert got.ending.finish_reason == "stop" and got.ending.stop_sequence == "S"
    assert not got.ending.cancelled


# -- one record -------------------------------------------------------------------------------
def test_status_row_and_log_line_come_from_the_same_record() -> None:
    stats = GenerationStats(10, 4, 5, 0.01, 0.05, ())
    r = RequestRecord(
        id="x",
        api="messages",
        model="m",
        stream=True,
        request_class="chat.think-off.user.lt1k",
        mode="spec",
        outcome="success",
        status=200,
        finish_reason="stop",
        error=None,
        timings=Timings(queue_s=0.1, prefill_s=0.01, decode_s=0.05, ttft_s=0.2, e2e_s=0.3),
        stats=stats,
        prep=None,
        finished_at=time.time(),
    )
    row, line = status_row(r), log_fields(r)
    for key in ("id", "endpoint", "request_class", "mode", "outcome", "finish_reason"):
        assert row[key] == line[key]
    assert row["endpoint"] == "messages"
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (10, 4, 5)
    assert (line["prompt_tokens"], line["cached_tokens"], line["completion_tokens"]) == (10, 4, 5)
    failed = dataclasses.replace(r, stats=None, outcome="error", status=400, error="bad")
    assert log_fields(failed)["completion_tokens"] is None
    assert status_row(failed)["completion_tokens"] == 0


# -- a dialect plugs in -----------------------------------------------------------------------
class ShoutDialect:
    """A toy dialect: {"say": text} in, the model's text upper-cased out; its own error shape."""

    api = "shout"
    id_prefix = "shout"

    def parse(self, body: dict[str, Any], ctx: GatewayContext) -> Parsed:
        if not isinstance(body.get("say"), str):
            raise BadRequest("say: a string is required", param="say")
        return Parsed(body, ctx.resolve_model(None), bool(body.get("stream")), [])

    def request(self, wire: dict[str, Any]) -> ApiRequest:
        return ApiRequest(Conversation(({"role": "user", "content": wire["say"]},)), max_tokens=64)

    def response(self, run: RequestRun, parsed: Parsed, result: Collected) -> dict[str, Any]:
        text = result.message().content
        return {"shout": text.upper(), "finish": result.ending.finish_reason, "id": run.request_id}

    def encoder(self, run: RequestRun, parsed: Parsed) -> Any:
        class Enc:
            def start(self) -> str:
                return "begin\n"

            def batch(self, batch: Any) -> str:
                return "".join(d.text.upper() for d in batch.deltas)

            def end(self, ending: Any) -> str:
                return f"\nend {ending.finish_reason}\n"

            def error(self, err: GatewayError) -> str:
                return f"\nerror {err.message}\n"

        return Enc()

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        return {"oops": err.message}


def test_a_new_dialect_runs_on_the_shared_path_with_its_own_shapes() -> None:
    engine = FakeEngine()
    dialect = ShoutDialect()

    async def shout(request: Any) -> Any:
        return await handle(request, dialect)

    with serve(engine) as s:
        app = s.server.config.app
        app.router.routes.append(
            Route("/shout", api_route(shout, dialect.error_body), methods=["POST"])
        )
        r = httpx.post(f"{s.url}/shout", json={"say": "SCRIPT:hello there"})
        assert r.status_code == 200
        assert r.json()["shout"] == "HELLO THERE" and r.json()["finish"] == "stop"
        streamed = httpx.post(f"{s.url}/shout", json={"say": "SCRIPT:hello there", "stream": 1})
        assert streamed.text == "begin\nHELLO THERE\nend stop\n"
        bad = httpx.post(f"{s.url}/shout", json={"say": 3})
        assert bad.status_code == 400 and bad.json() == {"oops": "say: a string is required"}
        status = httpx.get(f"{s.v1}/status").json()
        assert [row["endpoint"] for row in status["recent"][:2]] == ["shout", "shout"]
        metrics = httpx.get(f"{s.url}/metrics").text
        assert 'api="shout"' in metrics
