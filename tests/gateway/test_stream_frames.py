"""The streaming write path's shortcuts give what the general path gives: a chat stream's plain
text chunks spliced into a frame are the chunks the pydantic models dump, and a job fed from
the event loop's own thread (an upstream's relay) wakes its reader without a cross-thread call."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from toolflash.engine.api import TokenEvent
from toolflash.gateway import sse
from toolflash.gateway.chat_output import ContentDelta, ReasoningDelta, ToolCallDelta
from toolflash.gateway.dialects.chat import ChatStream, delta_messages
from toolflash.gateway.protocol import ChatCompletionChunk, ChunkChoice
from toolflash.gateway.reader import Batch
from toolflash.gateway.worker import Job, Prepared

TEXTS = [
    " hello",
    'quote " and \\ back',
    "é ü 漢字 😀",
    "line\nbreak\ttab\r",
    "\x00\x01\x1f\x7f",
    "\u2028",
]


def _stream(model: str = "tiny/model") -> ChatStream:
    run: Any = SimpleNamespace(request_id="chatcmpl-1", model=model, wants_logprobs=False)
    return ChatStream(run, include_usage=False)


def _dumped(stream: ChatStream, deltas: list[Any]) -> str:
    """What the models give for these deltas (the general path)."""
    return "".join(
        sse.event(
            ChatCompletionChunk(
                id="chatcmpl-1",
                created=stream.created,
                model=stream.run.model,
                choices=[ChunkChoice(delta=d)],
            )
        )
        for d in delta_messages(deltas)
    )


@pytest.mark.parametrize("kind", [ContentDelta, ReasoningDelta])
@pytest.mark.parametrize("text", TEXTS)
def test_text_chunks_equal_the_models_dump(kind: type, text: str) -> None:
    stream = _stream()
    deltas = [kind(text), kind("!")]
    out = stream.batch(Batch(deltas, []))
    assert out == _dumped(stream, deltas)
    body = json.loads(out.removeprefix("data: "))
    field = "content" if kind is ContentDelta else "reasoning_content"
    assert body["choices"][0]["delta"] == {field: text + "!"}


def test_frame_survives_a_model_name_that_needs_escaping() -> None:
    stream = _stream(model='m"\x00toolflash-text\x00')
    assert stream.batch(Batch([ContentDelta("x")], [])) == _dumped(stream, [ContentDelta("x")])


def test_mixed_batches_take_the_general_path() -> None:
    stream = _stream()
    deltas = [ReasoningDelta("think"), ContentDelta("say")]
    assert stream.batch(Batch(deltas, [])) == _dumped(stream, deltas)
    call = [ToolCallDelta(index=0, id="call_1", name="f", arguments="{}")]
    assert stream.batch(Batch(call, [])) == _dumped(stream, call)


def test_a_push_on_the_loop_thread_wakes_the_reader_directly() -> None:
    async def main() -> None:
        job = Job("job", lambda engine: Prepared(None, None))
        loop = asyncio.get_running_loop()
        calls: list[Any] = []
        real = loop.call_soon_threadsafe

        def counted(*args: Any) -> Any:
            calls.append(args)
            return real(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
        try:
            batches = job.batches()
            reading = asyncio.ensure_future(anext(batches))
            await asyncio.sleep(0)  # the reader waits
            job.push("event", TokenEvent((), "a"))
            assert await asyncio.wait_for(reading, 1) == [TokenEvent((), "a")]
            assert calls == []
        finally:
            del loop.call_soon_threadsafe

    asyncio.run(main())
