"""Engine events reach the event loop in batches (`Job.batches`), and a stream writes a batch
of deltas at once: the chunks a client reassembles are the same whether each cycle goes out on
its own or many go out together."""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time

import httpx
import pytest

from tests.gateway.conftest import serve
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_openai_sdk import READ_TOOL, RUN_TOOL, hermes_call, user
from toolflash.engine.api import FinishEvent, GenerationStats, TokenEvent
from toolflash.gateway.chat_output import ChatOutput
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.handler import read_interval_s
from toolflash.gateway.reader import TextOutput
from toolflash.gateway.tool_parsers import get_parser
from toolflash.gateway.worker import Job, Prepared


def _token(i: int) -> TokenEvent:
    return TokenEvent((i,), chr(ord("a") + i % 26))


def _finish() -> FinishEvent:
    return FinishEvent("stop", GenerationStats(1, 0, 0, 0.0, 0.0, ()))


def _job() -> Job:
    return Job("job", lambda engine: Prepared(None, None))  # type: ignore[arg-type]


def test_items_pushed_meanwhile_come_in_one_batch() -> None:
    async def main() -> None:
        job = _job()
        prepared = Prepared(None, None)  # type: ignore[arg-type]
        job.push("prepared", prepared)
        job.push("event", _token(0))
        assert await job.wait_prepared() is prepared  # the event it took stays for batches()
        batches = job.batches(min_interval_s=0.01)
        first = await anext(batches)
        handed = time.perf_counter()
        for i in (1, 2, 3):
            job.push("event", _token(i))
        second = await anext(batches)
        assert time.perf_counter() - handed >= 0.01 * 0.99  # paced: one interval at least
        job.push("event", fin := _finish())
        third = await anext(batches)
        assert [e.token_ids for e in first] == [(0,)]
        assert second == [_token(1), _token(2), _token(3)]
        assert third == [fin]
        with pytest.raises(StopAsyncIteration):
            await anext(batches)

    asyncio.run(main())


@pytest.mark.parametrize("ending", ["finish", "error"])
def test_the_end_of_a_job_is_not_held_back_by_pacing(ending: str) -> None:
    # An hour's interval: only the end (FinishEvent or error) cuts the pause short.
    async def main() -> None:
        job = _job()
        job.push("event", _token(0))
        batches = job.batches(min_interval_s=3600)
        assert await anext(batches) == [_token(0)]
        job.push("event", _token(1))

        def end() -> None:
            if ending == "finish":
                job.push("event", _finish())
            else:
                job.push("error", RuntimeError("engine failed"))

        threading.Timer(0.01, end).start()
        if ending == "finish":
            last = await asyncio.wait_for(anext(batches), timeout=30)
            assert last == [_token(1), _finish()]
        else:
            assert await asyncio.wait_for(anext(batches), timeout=30) == [_token(1)]
            with pytest.raises(RuntimeError, match="engine failed"):
                await anext(batches)

    asyncio.run(main())


def test_a_reader_paced_to_the_end_takes_the_rest_when_the_job_ends() -> None:
    # math.inf (a complete response): after the first batch, no wake-up until the end.
    async def main() -> None:
        job = _job()
        job.push("event", _token(0))
        batches = job.batches(min_interval_s=math.inf)
        assert await anext(batches) == [_token(0)]
        pending = asyncio.ensure_future(anext(batches))
        for i in (1, 2, 3):
            job.push("event", _token(i))
            await asyncio.sleep(0.01)
            assert not pending.done() and job._waiter is not None  # asleep, not woken
        job.push("event", fin := _finish())
        assert await asyncio.wait_for(pending, timeout=30) == [*map(_token, (1, 2, 3)), fin]

    asyncio.run(main())


def test_the_first_token_is_timed_when_pushed_not_when_read() -> None:
    async def main() -> None:
        job = _job()
        job.push("event", TokenEvent((), ""))  # a cycle that committed nothing
        assert job.first_token_at is None
        before = time.perf_counter()
        job.push("event", TokenEvent((), "Hi"))  # an upstream's token: text, no ids
        stamped = job.first_token_at
        assert stamped is not None and stamped >= before
        job.push("event", _token(1))
        assert job.first_token_at == stamped

    asyncio.run(main())


def test_complete_responses_read_at_the_end_unless_their_output_can_stop() -> None:
    config = GatewayConfig(stream_interval_ms=7)
    calls = ChatOutput(parser=get_parser("hermes"), tools={"run": {}}, start_in_reasoning=False)
    one_call = ChatOutput(
        parser=get_parser("hermes"),
        tools={"run": {}},
        start_in_reasoning=False,
        parallel_tool_calls=False,
    )
    assert read_interval_s(True, one_call, config) == 0.007
    assert read_interval_s(False, TextOutput(), config) == math.inf
    assert read_interval_s(False, calls, config) == math.inf
    assert read_interval_s(False, one_call, config) == 0.0  # stops the engine after one call


def test_a_complete_response_reports_its_first_token_not_its_end() -> None:
    body = {"model": "fake-model", "messages": user("SCRIPT:" + "x" * 60)}
    with serve(FakeEngine(cycle_delay_s=0.005)) as s:
        r = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=20).json()
    timings = r["toolflash"]["timings"]
    assert r["choices"][0]["message"]["content"] == "x" * 60
    assert timings["ttft_s"] < timings["e2e_s"] / 2  # ~24 cycles of 5 ms after the first


def test_an_error_is_raised_after_the_events_before_it() -> None:
    async def main() -> None:
        job = _job()
        job.push("event", _token(0))
        job.push("event", _token(1))
        job.push("error", RuntimeError("engine failed"))
        got = []
        with pytest.raises(RuntimeError, match="engine failed"):
            async for batch in job.batches():
                got += batch
        assert got == [_token(0), _token(1)]

    asyncio.run(main())


@pytest.mark.parametrize("interval", [0.0, 0.002])
def test_no_event_is_lost_or_reordered_across_threads(interval: float) -> None:
    # The worker thread pushes while the reader alternates between waiting and being busy:
    # every push that finds the reader waiting must wake it (a lost wake-up hangs here).
    n = 3000

    async def main() -> None:
        job = _job()

        def worker() -> None:
            rng = random.Random(7)
            for i in range(n):
                job.push("event", _token(i))
                if rng.random() < 0.05:
                    time.sleep(rng.random() * 1e-3)
            job.push("event", _finish())

        thread = threading.Thread(target=worker)
        thread.start()
        got: list[int] = []

        async def read() -> None:
            async for batch in job.batches(interval):
                got.extend(e.token_ids[0] for e in batch if isinstance(e, TokenEvent))

        await asyncio.wait_for(read(), timeout=60)
        thread.join()
        assert got == list(range(n))

    asyncio.run(main())


def _chunks(url: str, body: dict) -> list[dict]:
    import httpx

    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=20) as r:
        r.raise_for_status()
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
    return [json.loads(e[6:]) for e in events[:-2]]


def _fold(chunks: list[dict]) -> dict:
    """What a client reassembles: texts, calls (ids dropped), logprob tokens, finish."""
    out: dict = {"content": "", "reasoning": "", "calls": {}, "logprobs": [], "finish": None}
    for ch in chunks:
        for choice in ch["choices"]:
            d = choice["delta"]
            out["content"] += d.get("content") or ""
            out["reasoning"] += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                call = out["calls"].setdefault(tc["index"], {"name": None, "arguments": ""})
                call["name"] = call["name"] or tc["function"].get("name")
                call["arguments"] += tc["function"].get("arguments") or ""
            out["logprobs"] += [
                e["token"] for e in (choice.get("logprobs") or {}).get("content") or []
            ]
            out["finish"] = choice.get("finish_reason") or out["finish"]
    return out


@pytest.mark.parametrize("thinking", [False, True])
def test_coalesced_stream_reassembles_to_the_same_message(thinking: bool) -> None:
    script = (
        ("<think>\nfirst the file, then the command\n</think>\n\n" if thinking else "")
        + "Reading it. é 世界 🙂\n"
        + hermes_call("read_file", {"path": "src/a.py", "limit": 5})
        + "\n"
        + hermes_call("run", {"cmd": 'grep -n "x" b.py'})
    )
    body = {
        "model": "fake-model",
        "messages": user("SCRIPT:" + script),
        "tools": [READ_TOOL, RUN_TOOL],
        "stream": True,
        "logprobs": True,
        "stream_options": {"include_usage": True},
    }
    # One write per cycle (cycles further apart than the interval) against one write per
    # 50 ms (an instant engine: nearly everything in one write).
    with serve(FakeEngine(cycle_delay_s=0.002), GatewayConfig(stream_interval_ms=0)) as s:
        each = _chunks(s.url, body)
    with serve(FakeEngine(), GatewayConfig(stream_interval_ms=50)) as s:
        together = _chunks(s.url, body)
        whole = s.client().chat.completions.create(**{**body, "stream": False})
    assert _fold(each) == _fold(together)
    assert len(together) < len(each)
    folded = _fold(together)
    assert folded["finish"] == "tool_calls" and [c["name"] for c in folded["calls"].values()] == [
        "read_file",
        "run",
    ]
    message = whole.choices[0].message
    assert folded["content"] == (message.content or "")
    assert [c.function.arguments for c in message.tool_calls or []] == [
        c["arguments"] for c in folded["calls"].values()
    ]
    assert folded["logprobs"] == [e.token for e in whole.choices[0].logprobs.content]
    # Same envelope on every chunk; usage and the toolflash object on the last.
    assert {c["id"] for c in together} == {together[0]["id"]}
    assert together[-1]["usage"]["completion_tokens"] == len(script)


def _completion_chunks(url: str, body: dict) -> list[dict]:
    import httpx

    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=20) as r:
        r.raise_for_status()
        events = r.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    return [json.loads(e[6:]) for e in events[:-2]]


def test_coalesced_completion_stream_has_the_same_text_and_logprobs() -> None:
    body = {
        "model": "fake-model",
        "prompt": "SCRIPT:def f(x):\n    return x * 2  # é 世界 🙂\n",
        "stream": True,
        "logprobs": 2,
    }

    def fold(chunks: list[dict]) -> tuple[str, list, list, str | None]:
        text, tokens, offsets, finish = "", [], [], None
        for ch in chunks:
            for choice in ch["choices"]:
                text += choice["text"]
                lp = choice.get("logprobs") or {}
                tokens += lp.get("tokens") or []
                offsets += lp.get("text_offset") or []
                finish = choice.get("finish_reason") or finish
        return text, tokens, offsets, finish

    with serve(FakeEngine(cycle_delay_s=0.002), GatewayConfig(stream_interval_ms=0)) as s:
        each = _completion_chunks(s.url, body)
    with serve(FakeEngine(), GatewayConfig(stream_interval_ms=50)) as s:
        together = _completion_chunks(s.url, body)
    assert fold(each) == fold(together)
    assert fold(together)[0] == body["prompt"][len("SCRIPT:") :]
    assert len(together) < len(each)
