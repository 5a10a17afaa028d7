"""The engine worker's continuous batch: admission up to `max_batch`, the bounded queue beyond
it, a slot freed the step its job ends or its client leaves, each job's events unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.fake_engine import FakeEngine
from toolflash.engine.api import FinishEvent, GenerationRequest, TokenEvent
from toolflash.engine.batching.api import GeneratorBatcher, batcher_for, default_max_batch
from toolflash.gateway.errors import Overloaded
from toolflash.gateway.worker import EngineWorker, Job, Prepared
from toolflash.policy.request_class import RequestClass

pytest.importorskip("mlx.core")

CLASS = RequestClass("chat", "off", False, "lt1k")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.engine.model_dirs import write_draft, write_qwen35_target
    from toolflash.engine.factory import build_engine

    root: Path = tmp_path_factory.mktemp("worker-models")
    config = write_qwen35_target(root / "target")
    write_draft(root / "draft", config)
    return build_engine(str(root / "target"), str(root / "draft"))


def started(engine: Any, max_batch: int, max_queue: int = 8) -> EngineWorker:
    worker = EngineWorker(lambda: engine, max_queue=max_queue, max_batch=max_batch)
    worker.start()
    assert worker.ready.wait(10)
    return worker


def job(name: str, request: GenerationRequest) -> Job:
    return Job(name, lambda _engine: Prepared(request, CLASS))


async def collect(j: Job, on_event: Callable[[Job, int], None] | None = None) -> list[int]:
    await j.wait_prepared()
    tokens: list[int] = []
    async for event in j.events():
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
            if on_event is not None:
                on_event(j, len(tokens))
        else:
            assert isinstance(event, FinishEvent)
    return tokens


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline
        await asyncio.sleep(0.001)


def alone(engine: Any, request: GenerationRequest) -> list[int]:
    return [t for e in engine.generate(request) if isinstance(e, TokenEvent) for t in e.token_ids]


def requests(engine: Any, n: int, max_tokens: int = 24) -> list[GenerationRequest]:
    texts = ["def add(a, b):", "Hello world", "import os", "x = [1, 2"]
    return [
        GenerationRequest(tuple(engine.encode(texts[i % 4] + str(i))), max_tokens + 5 * i)
        for i in range(n)
    ]


def test_concurrent_jobs_run_together_with_their_own_outputs(engine: Any) -> None:
    reqs = requests(engine, 4)
    expected = [alone(engine, r) for r in reqs]
    worker = started(engine, max_batch=4)
    seen: list[int] = []

    async def main() -> list[list[int]]:
        jobs = [job(f"j{i}", r) for i, r in enumerate(reqs)]
        for j in jobs:
            worker.submit(j)
        return await asyncio.gather(
            *(collect(j, lambda _j, _n: seen.append(worker.running)) for j in jobs)
        )

    try:
        assert asyncio.run(main()) == expected
    finally:
        worker.stop()
    assert max(seen) >= 2  # they ran in one batch, not one after another
    assert worker.running == 0


def test_queue_beyond_the_batch_is_bounded(engine: Any) -> None:
    reqs = requests(engine, 4, max_tokens=60)
    worker = started(engine, max_batch=2, max_queue=1)

    async def main() -> None:
        jobs = [job(f"j{i}", r) for i, r in enumerate(reqs[:3])]
        for n, j in enumerate(jobs[:2]):
            worker.submit(j)
            await until(lambda n=n: worker.running == n + 1)  # type: ignore[misc]
        worker.submit(jobs[2])  # two run, one waits
        with pytest.raises(Overloaded) as refused:
            worker.submit(job("j3", reqs[3]))
        assert int(refused.value.headers["Retry-After"]) >= 1
        outs = await asyncio.gather(*(collect(j) for j in jobs))
        assert outs == [alone(engine, r) for r in reqs[:3]]

    try:
        asyncio.run(main())
    finally:
        worker.stop()


def test_cancelled_job_frees_its_slot_at_once(engine: Any) -> None:
    reqs = [GenerationRequest(r.prompt_tokens, 400, ignore_eos=True) for r in requests(engine, 2)]
    short = requests(engine, 3)[2]
    worker = started(engine, max_batch=2)

    async def main() -> None:
        long_jobs = [job("a", reqs[0]), job("b", reqs[1])]
        for j in long_jobs:
            worker.submit(j)

        def leave(j: Job, n: int) -> None:
            if j.id == "b" and n >= 5:
                j.cancel.set()

        waiting = job("c", short)
        results = asyncio.gather(*(collect(j, leave) for j in long_jobs))
        await asyncio.sleep(0)
        worker.submit(waiting)
        out_c = await collect(waiting)
        assert out_c == alone(engine, short)
        # c ran while a was still going: b's slot was freed when b's client left.
        assert not long_jobs[0].cancel.is_set()
        long_jobs[0].cancel.set()
        a, b = await results
        assert len(b) < 400 and len(a) < 400

    try:
        asyncio.run(main())
    finally:
        worker.stop()


def test_client_leaving_during_a_long_prefill_disturbs_no_one(engine: Any) -> None:
    """A job whose client leaves while its long prompt prefills (on the prefill thread, where
    the machine has two cores) ends without output; the job decoding beside it and the next
    job get the tokens they get alone."""
    running = GenerationRequest(requests(engine, 1)[0].prompt_tokens, 120, ignore_eos=True)
    long_prompt = tuple(engine.encode("the quick brown fox jumps over the lazy dog " * 300))
    assert len(long_prompt) > 4 * engine.options.prefill_chunk
    after = requests(engine, 3)[2]
    worker = started(engine, max_batch=3)

    async def main() -> None:
        a = job("a", running)
        worker.submit(a)
        results = asyncio.create_task(collect(a))
        await until(lambda: worker.running == 1)
        b = job("b", GenerationRequest(long_prompt, 8))
        worker.submit(b)
        await b.wait_prepared()
        b.cancel.set()
        c = job("c", after)
        worker.submit(c)
        assert await collect(c) == alone(engine, after)
        assert await results == alone(engine, running)
        await until(lambda: worker.running == 0)

    try:
        asyncio.run(main())
    finally:
        worker.stop()


def test_engines_without_a_batcher_run_one_job_at_a_time() -> None:
    fake = FakeEngine()
    batcher = batcher_for(fake, 8)
    assert isinstance(batcher, GeneratorBatcher) and batcher.capacity == 1
    worker = EngineWorker(lambda: fake, max_queue=4, max_batch=8)
    worker.start()
    assert worker.ready.wait(10)
    try:
        assert worker.max_batch == 1
    finally:
        worker.stop()


def test_default_max_batch_is_sized_to_the_machine() -> None:
    assert 2 <= default_max_batch() <= 16
    with pytest.raises(ValueError):
        EngineWorker(lambda: FakeEngine(), max_queue=1, max_batch=0)


def test_request_waits_for_memory_and_one_that_never_fits_is_refused(engine: Any) -> None:
    from toolflash.engine.batching.memory import sequence_cost

    reqs = requests(engine, 2, max_tokens=200)
    tokens = [len(r.prompt_tokens) + r.max_tokens for r in reqs]
    limit = sequence_cost(engine.target).bytes_for(max(tokens)) * 3 // 2
    worker = EngineWorker(lambda: engine, max_queue=4, max_batch=4, memory_limit=limit)
    worker.start()
    assert worker.ready.wait(10)
    seen: list[int] = []

    async def main() -> None:
        jobs = [job("a", reqs[0]), job("b", reqs[1])]
        for j in jobs:
            worker.submit(j)
        outs = await asyncio.gather(
            *(collect(j, lambda _j, _n: seen.append(worker.running)) for j in jobs)
        )
        assert outs == [alone(engine, r) for r in reqs]  # b waited for a's memory, then ran
        huge = job("c", GenerationRequest(reqs[0].prompt_tokens, 100_000))
        worker.submit(huge)
        with pytest.raises(Overloaded) as refused:
            await collect(huge)
        assert int(refused.value.headers["Retry-After"]) >= 1

    try:
        asyncio.run(main())
    finally:
        worker.stop()
    assert max(seen) == 1  # never both at once: the budget held one


def test_the_prefill_thread_setting_reaches_the_batcher(engine: Any) -> None:
    from toolflash.engine.batching.batcher import EngineBatcher

    for setting, expected in ((True, True), (False, False)):
        batcher = batcher_for(engine, 4, None, setting)
        assert isinstance(batcher, EngineBatcher)
        assert (batcher._thread is not None) is expected
