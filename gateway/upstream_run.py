"""Requests for a model served by upstream pools: a `Job` fed by an asyncio task that streams
the upstream's chat completion (`gateway/upstream_stream.py`), so the shared reader, record and
dialects serve it as they serve the local engine's jobs.

The task orders the model's pools (`upstream_choice.choose`: by the decode speed measured per
request class, or by load), takes the least-loaded replica of the first pool that has one free
(`upstream_pool.pick`), and until the upstream's first chunk arrives moves a failed request to
the next replica, of that pool then of the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from toolflash.engine.api import Engine, GenerationRequest, SamplingParams
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.prepare import request_class
from toolflash.gateway.prompt import Prompt
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.upstream_choice import PoolState, SpeedTable, choose
from toolflash.gateway.upstream_config import UpstreamPool, UpstreamsFile
from toolflash.gateway.upstream_engine import UpstreamEngine
from toolflash.gateway.upstream_http import UpstreamClient
from toolflash.gateway.upstream_pool import pick
from toolflash.gateway.upstream_stream import PoolRoute, Retry, UpstreamUnavailable
from toolflash.gateway.upstream_wire import chat_body
from toolflash.gateway.worker import Job, Prepared

log = structlog.get_logger("toolflash.gateway.upstream")

# Characters of a conversation's JSON per prompt token, for the request class's length band (the
# upstream's tokenizer is not here): English text and JSON run about four.
CHARS_PER_TOKEN = 4


class _CancelEvent(threading.Event):
    """The job's cancel flag; setting it (client gone, one call done) also stops the task."""

    def __init__(self, on_set: Callable[[], None]) -> None:
        super().__init__()
        self._on_set = on_set

    def set(self) -> None:
        super().set()
        self._on_set()


def upstream_preparer(req: ApiRequest, config: GatewayConfig, request_id: str) -> Any:
    """The request's budget, class and sampling as the record reports them (the prompt's
    tokens are not counted here: the upstream tokenizes; its usage fills the counts at the end,
    and the class's length band reads an estimate from the conversation's size)."""

    def prepare(engine: Engine) -> Prepared:
        requested = req.max_tokens
        cap = min(config.default_max_tokens, engine.context_length)
        max_tokens = min(requested, engine.context_length) if requested else cap
        s = req.sampling
        sampling = SamplingParams(
            temperature=s.temperature or 0.0,
            top_p=s.top_p if s.top_p is not None else 1.0,
            top_k=s.top_k or 0,
            min_p=s.min_p or 0.0,
            seed=s.seed,
            frequency_penalty=s.frequency_penalty or 0.0,
            presence_penalty=s.presence_penalty or 0.0,
        )
        klass = request_class(
            req, Prompt((0,) * _prompt_estimate(req)), sampled=not sampling.greedy
        )
        request = GenerationRequest(
            prompt_tokens=(),
            max_tokens=max_tokens,
            mode="ar",
            stop_strings=req.stop,
            sampling=sampling,
            request_id=request_id,
        )
        return Prepared(request, klass, max_tokens_clamped=bool(requested and requested > cap))

    return prepare


def _prompt_estimate(req: ApiRequest) -> int:
    """Prompt tokens estimated from the conversation's JSON size (the class's length band)."""
    conv = req.conversation
    if conv is None:
        return 0
    tools = [t.template for t in conv.tools]
    size = len(json.dumps([list(conv.messages), tools], default=str, ensure_ascii=False))
    return size // CHARS_PER_TOKEN


class UpstreamRoute:
    """One model: its pools, its engine view and the requests it streams."""

    def __init__(
        self,
        file: UpstreamsFile,
        pools: tuple[UpstreamPool, ...],
        client: UpstreamClient,
        speeds: SpeedTable,
    ) -> None:
        self.model = pools[0].model
        self.engine = UpstreamEngine(pools[0])  # the file checks the pools agree on it
        self.pools = [PoolRoute(p, client) for p in pools]
        self._file = file
        self._speeds = speeds
        self._tasks: set[asyncio.Task[None]] = set()

    def healthy(self) -> bool:
        return any(p.healthy() for p in self.pools)

    def start(self, req: ApiRequest, job_id: str, config: GatewayConfig) -> Job:
        """A job whose events come from this model's pools (the task starts at once)."""
        job = Job(job_id, upstream_preparer(req, config, job_id))
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._run(job, req))

        def stop() -> None:
            loop.call_soon_threadsafe(task.cancel)

        job.cancel = _CancelEvent(stop)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(self, job: Job, req: ApiRequest) -> None:
        try:
            await self._route(job, req)
        except Exception as exc:  # a bug of ours: the client gets a 500, never a hung request
            log.error("upstream_task_failed", id=job.id, error=repr(exc))
            job.push("error", exc)

    def order(self, label: str, tried: set[str]) -> tuple[list[PoolRoute], str]:
        """The pools in the order to try them for a request of class `label`, and why."""
        now = time.monotonic()
        states = [
            PoolState(p.name, p.load(now, tried), self._speeds.get(p.name, label))
            for p in self.pools
        ]
        f = self._file
        choice = choose(states, f.route, label, random.random(), f.explore_p, f.min_samples)
        by_name = {p.name: p for p in self.pools}
        return [by_name[n] for n in choice.order], choice.reason

    async def _route(self, job: Job, req: ApiRequest) -> None:
        job.started_at = time.perf_counter()
        try:
            prepared = job.prepare(self.engine)
            label = prepared.request_class.label
        except Exception as exc:
            job.push("error", exc)
            return
        tried: set[str] = set()
        errors: list[str] = []
        order, reason = self.order(label, tried)
        while True:
            now = time.monotonic()
            chosen = next(
                (
                    (p, r)
                    for p in order
                    if (r := pick(p.replicas, now, p.pool.capacity, tried)) is not None
                ),
                None,
            )
            if chosen is None:
                detail = "; ".join(errors) or "every replica is unhealthy, cooling down or full"
                job.push(
                    "error",
                    UpstreamUnavailable(
                        f"no upstream of model {self.model!r} could serve the request: {detail}",
                        headers={"Retry-After": "5"},
                    ),
                )
                return
            pool, replica = chosen
            tried.add(replica.url)
            body = chat_body(req, pool.pool.sent_model, prepared.request.max_tokens)
            if len(self.pools) == 1:
                why = ""  # nothing to choose: the record says which replica only
            else:
                why = reason if pool is order[0] and not errors else f"pool {pool.name}: retry"
            try:
                speed = await pool.stream(job, replica, body, replace(prepared, route=why))
            except Retry as exc:
                errors.append(f"{replica.url}: {exc}")
                log.warning("upstream_retry", id=job.id, upstream=replica.url, error=str(exc))
                continue
            except asyncio.CancelledError:
                return
            if speed is not None:
                self._speeds.add(pool.name, label, speed)
            return

    async def check_health(self) -> None:
        await asyncio.gather(*(p.check_health() for p in self.pools))

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class UpstreamPools:
    """Every pool of an `--upstreams` file, by client model name, with their health checks."""

    def __init__(self, pools: UpstreamsFile) -> None:
        # One connection pool for all replicas; limits are the pools' capacities.
        self._client = UpstreamClient(max_idle_per_origin=64)
        self.speeds = SpeedTable()
        self.routes = {
            model: UpstreamRoute(pools, group, self._client, self.speeds)
            for model, group in pools.models().items()
        }
        self._health: asyncio.Task[None] | None = None

    @property
    def models(self) -> list[str]:
        return list(self.routes)

    def start(self) -> None:
        self._health = asyncio.get_running_loop().create_task(self._health_loop())

    async def _health_loop(self) -> None:
        pools = [p for route in self.routes.values() for p in route.pools]
        due = [0.0] * len(pools)
        while True:
            now = time.monotonic()
            for i, pool in enumerate(pools):
                if now >= due[i]:
                    due[i] = now + pool.pool.health_interval_s
                    await pool.check_health()
            await asyncio.sleep(max(0.05, min(due) - time.monotonic()))

    async def close(self) -> None:
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        for route in self.routes.values():
            await route.cancel_all()
        await self._client.aclose()

    def counters(self) -> dict[str, list[dict[str, Any]]]:
        """Per-replica gauges for /metrics (`toolflash:upstream_*{model, pool, upstream}`), and
        each pool's measured decode speed per request class
        (`toolflash:upstream_decode_tokens_per_s{model, pool, class}`)."""
        out: dict[str, list[dict[str, Any]]] = {
            "in_flight": [],
            "requests": [],
            "errors": [],
            "healthy": [],
            "circuit_open": [],
            "decode_tokens_per_s": [],
        }
        now = time.monotonic()
        model_of = {}
        for name, route in self.routes.items():
            for pool in route.pools:
                model_of[pool.name] = name
                for r in pool.replicas:
                    labels = {"model": name, "pool": pool.name, "upstream": r.url}
                    out["in_flight"].append({"labels": labels, "value": r.in_flight})
                    out["requests"].append({"labels": labels, "value": r.requests})
                    out["errors"].append({"labels": labels, "value": r.errors})
                    out["healthy"].append({"labels": labels, "value": int(r.healthy)})
                    out["circuit_open"].append({"labels": labels, "value": int(now < r.open_until)})
        for (pool_name, label), speed in sorted(self.speeds.items().items()):
            labels = {"model": model_of[pool_name], "pool": pool_name, "class": label}
            out["decode_tokens_per_s"].append({"labels": labels, "value": speed.tokens_per_s})
        return out
