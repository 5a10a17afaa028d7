"""Queueing, cancellation, auth, readiness: behaviour that needs timing (slow fake engine)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import httpx
import openai
import pytest
import structlog.testing

from tests.gateway.conftest import serve
from tests.gateway.fake_engine import FakeEngine
from toolflash.engine.api import CycleRecord, GenerationStats, ModeDecision
from toolflash.gateway.app import create_app
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.prepare import ControllerRequest

LONG = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "SCRIPT:" + "word " * 400}],
}


def wait_for(pred, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_disconnect_mid_stream_frees_the_engine() -> None:
    engine = FakeEngine(cycle_delay_s=0.01)
    with serve(engine) as s:
        with httpx.stream("POST", f"{s.v1}/chat/completions", json={**LONG, "stream": True}) as r:
            lines = r.iter_lines()
            for _ in range(5):
                next(lines)
            assert engine.active.is_set()
        # the connection is closed: generation stops within a few cycles
        assert wait_for(lambda: not engine.active.is_set(), 2.0)
        assert engine.finishes[-1] == "cancelled"
        status = httpx.get(f"{s.v1}/status").json()
        assert wait_for(lambda: httpx.get(f"{s.v1}/status").json()["current"] is None, 2.0)
        assert status["queue"]["waiting"] == 0
        recent = httpx.get(f"{s.v1}/status").json()["recent"][0]
        assert recent["outcome"] == "cancelled"
        r2 = httpx.post(f"{s.v1}/chat/completions", json={**LONG, "max_tokens": 3}, timeout=5)
        assert r2.status_code == 200


def test_non_streaming_disconnect_cancels() -> None:
    engine = FakeEngine(cycle_delay_s=0.01)
    with serve(engine) as s:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{s.v1}/chat/completions", json=LONG, timeout=0.3)
        assert wait_for(lambda: bool(engine.finishes), 2.0)
        assert engine.finishes[-1] == "cancelled"


def test_queue_full_gives_429_with_retry_after_and_fifo() -> None:
    engine = FakeEngine(cycle_delay_s=0.01)
    # The order the engine took the requests in (the clients' threads may be scheduled in
    # either order once both responses are out).
    order: list[str] = []
    generate = engine.generate

    def record(request, *args):  # type: ignore[no-untyped-def]
        order.append("a" if request.max_tokens == 300 else "b")
        return generate(request, *args)

    engine.generate = record  # type: ignore[method-assign]
    with serve(engine, GatewayConfig(max_queue=1)) as s:
        results: dict[str, int] = {}

        def call(name: str, body: dict) -> None:
            r = httpx.post(f"{s.v1}/chat/completions", json=body, timeout=20)
            results[name] = r.status_code

        short = {"model": "fake-model", "messages": [{"role": "user", "content": "SCRIPT:ok"}]}
        a = threading.Thread(target=call, args=("a", {**LONG, "max_tokens": 300}))
        a.start()
        assert wait_for(engine.active.is_set)
        b = threading.Thread(target=call, args=("b", short))
        b.start()
        assert wait_for(lambda: httpx.get(f"{s.v1}/status").json()["queue"]["waiting"] == 1)
        r = httpx.post(f"{s.v1}/chat/completions", json=short, timeout=5)
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        a.join()
        b.join()
        assert results == {"a": 200, "b": 200} and order == ["a", "b"]
        assert (
            'toolflash:requests_rejected_total{status="429"} 1.0'
            in httpx.get(f"{s.url}/metrics").text
        )


def test_status_shows_current_request() -> None:
    engine = FakeEngine(cycle_delay_s=0.01)
    with serve(engine) as s:
        with httpx.stream("POST", f"{s.v1}/chat/completions", json={**LONG, "stream": True}) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            current = httpx.get(f"{s.v1}/status").json()["current"]
            assert current is not None and current["completion_tokens"] > 0
            assert current["mode"] == "spec" and current["request_class"].startswith("chat.")
            assert current["prompt_tokens"] > 0 and not current["cancelled"]


def test_api_key_enforced() -> None:
    with serve(FakeEngine(), GatewayConfig(api_key="s3cret")) as s:
        bad = s.client(api_key="wrong")
        with pytest.raises(openai.AuthenticationError) as exc:
            bad.models.list()
        assert exc.value.status_code == 401
        r = httpx.post(f"{s.v1}/chat/completions", json={"messages": []})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{s.url}/metrics").status_code == 401
        assert httpx.get(f"{s.url}/health").status_code == 200  # probes stay open
        good = s.client(api_key="s3cret")
        assert good.models.list().data[0].id == "fake-model"
        r2 = good.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in r2 if c.choices)
            == "Hello! You said: hi"
        )


def test_health_503_while_loading_then_200() -> None:
    release = threading.Event()
    engine = FakeEngine()

    def slow_factory() -> FakeEngine:
        release.wait(10)
        return engine

    with serve(engine, factory=slow_factory, wait_ready=False) as s:
        r = httpx.get(f"{s.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = httpx.post(
            f"{s.v1}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 503 and "retry-after" in r.headers
        release.set()
        assert wait_for(lambda: httpx.get(f"{s.url}/health").status_code == 200)
        assert engine.threads == {"toolflash-engine"} or not engine.threads


def test_engine_runs_on_one_worker_thread_and_prompts_render_off_it() -> None:
    engine = FakeEngine()
    with serve(engine) as s:
        c = s.client()
        for _ in range(3):
            c.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "x"}]
            )
        c.completions.create(model="fake-model", prompt="abc")
    assert engine.threads == {"toolflash-engine"}
    # Templates and tokenization run on the render threads, never on the engine thread.
    assert engine.encode_threads and all(
        t.startswith("toolflash-render") for t in engine.encode_threads
    )


def test_load_failure_reported() -> None:
    def broken() -> FakeEngine:
        raise RuntimeError("weights missing")

    with serve(FakeEngine(), factory=broken, wait_ready=False) as s:
        assert wait_for(lambda: httpx.get(f"{s.url}/health").json()["status"] == "failed")
        body = httpx.get(f"{s.url}/health").json()
        assert "weights missing" in body["error"]
        r = httpx.get(f"{s.v1}/models")
        assert r.status_code == 503 and "failed" in r.json()["error"]["message"]


class SwitchToAr:
    """A scripted policy: spec for three cycles, then AR."""

    def __init__(self) -> None:
        self.finished: list[int] = []

    def prepare(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> None:
        pass

    def observe_prefix(self, text: str) -> None:
        pass

    def start(
        self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0
    ) -> ModeDecision:
        return ModeDecision("spec", default_block_size, "start speculative")

    def after_step(self, record: CycleRecord, token_ids: Sequence[int], text: str) -> ModeDecision:
        if record.index >= 2:
            return ModeDecision("ar", 1, "low acceptance")
        return ModeDecision("spec", record.block_size, "keep")

    def finish(self, stats: GenerationStats) -> None:
        self.finished.append(stats.completion_tokens)


def test_policy_controller_decisions_are_reported() -> None:
    policy = SwitchToAr()
    classes: list[str] = []

    def factory(req: ControllerRequest) -> SwitchToAr:
        classes.append(req.request_class.label)
        assert req.model_id == "fake-model" and not req.start_in_reasoning
        return policy

    engine = FakeEngine()
    app_kw = {"controller_factory": factory}
    with serve(engine, app_kwargs=app_kw) as s:
        raw = s.client().chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "SCRIPT:" + "x" * 40}]
        )
        r = raw.parse()
        assert raw.headers["x-toolflash-mode"] == "spec+ar"
        tf = r.model_extra["toolflash"]
        assert tf["modes"] == ["spec", "ar"] and tf["mode"] == "spec+ar"
        assert [(d["cycle"], d["mode"], d["reason"]) for d in tf["decisions"]] == [
            (0, "spec", "start speculative"),
            (3, "ar", "low acceptance"),
        ]
        assert tf["spec_cycles"] == 3 and policy.finished == [40]
        assert classes == ["chat.think-default.user.lt1k"]
        assert 'mode="spec+ar"' in httpx.get(f"{s.url}/metrics").text


def test_one_log_line_per_request_without_prompt_text() -> None:
    secret = "SCRIPT:do not log this prompt"
    with serve(FakeEngine()) as s, structlog.testing.capture_logs() as logs:
        c = s.client()
        c.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": secret}]
        )
        list(
            c.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": secret}], stream=True
            )
        )
        httpx.post(f"{s.v1}/chat/completions", json={"messages": []})
    lines = [e for e in logs if e["event"] == "request"]
    assert len(lines) == 3
    for e in lines[:2]:
        for key in (
            "id",
            "request_class",
            "mode",
            "prompt_tokens",
            "completion_tokens",
            "ttft_s",
            "e2e_s",
            "outcome",
        ):
            assert key in e, key
        assert e["outcome"] == "success"
    assert lines[2]["status"] == 400
    assert all("do not log" not in repr(e) for e in logs)


def test_template_errors_are_client_errors() -> None:
    import jinja2

    class Strict(FakeEngine):
        def encode_chat(self, messages, tools=None, template_kwargs=None):  # type: ignore[no-untyped-def]
            if messages[0]["role"] != "system":
                raise jinja2.exceptions.TemplateError("System message must be at the beginning.")
            return super().encode_chat(messages, tools, template_kwargs)

    with serve(Strict()) as s:
        r = httpx.post(
            f"{s.v1}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 400 and "System message" in r.json()["error"]["message"]


def test_worker_call_runs_on_the_engine_thread_in_order() -> None:
    import asyncio

    engine = FakeEngine()
    app = create_app(lambda: engine)

    async def scenario() -> list[str]:
        async with app.router.lifespan_context(app) as state:
            worker = state["gateway"].worker
            assert await asyncio.to_thread(worker.ready.wait, 5)
            futures = [
                worker.call(lambda e, i=i: f"{i}:{threading.current_thread().name}")
                for i in range(3)
            ]
            return [f.result(5) for f in futures]

    assert asyncio.run(scenario()) == [f"{i}:toolflash-engine" for i in range(3)]


def test_client_leaving_the_queue_frees_its_slot() -> None:
    engine = FakeEngine(cycle_delay_s=0.01)
    with serve(engine, GatewayConfig(max_queue=1)) as s:
        a = threading.Thread(
            target=httpx.post,
            args=(f"{s.v1}/chat/completions",),
            kwargs={"json": {**LONG, "max_tokens": 400}, "timeout": 20},
        )
        a.start()
        assert wait_for(engine.active.is_set)
        with pytest.raises(httpx.ReadTimeout):  # B waits in the queue, then gives up
            httpx.post(f"{s.v1}/chat/completions", json={**LONG, "max_tokens": 5}, timeout=0.2)
        assert wait_for(lambda: httpx.get(f"{s.v1}/status").json()["queue"]["waiting"] == 0)
        assert engine.active.is_set()  # A still runs: B's slot was freed without the worker
        short = {"messages": [{"role": "user", "content": "SCRIPT:ok"}]}
        r = httpx.post(f"{s.v1}/chat/completions", json=short, timeout=20)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
        a.join()
        assert engine.finishes.count("stop") + engine.finishes.count("length") == 2  # B never ran
