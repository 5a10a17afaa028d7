"""What the gateway's worker needs from a batch scheduler (no `mlx` import: the gateway loads
this before any engine exists).

`batcher_for` picks the engine's own continuous batcher (`EngineBatcher`, batched forwards)
where the engine has one, else `GeneratorBatcher`, which interleaves `engine.generate`
generators one event each per step (any `Engine`; with `max_batch` 1 it is today's one request
at a time, exactly)."""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable, Iterator
from typing import Any, Literal, Protocol

import structlog

from ..api import Engine, EngineEvent, FinishEvent, GenerationRequest, ModeController

log = structlog.get_logger(__name__)

Outcome = list[EngineEvent] | BaseException
# Whether a request fits the batch's memory budget: now, once running ones finish, or never.
Admission = Literal["now", "wait", "never"]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS says, e.g. a container's
    CPU set), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_max_batch() -> int:
    """Sequences decoded together by default: 4 per CPU core, within 2..16 (on the 2-core
    machine the embedded pair was measured on, a batched AR step for 8 rows costs ~1.6x one
    row's, so 8 rows give ~5x the tokens per step)."""
    return max(2, min(16, 4 * usable_cores()))


class Batcher(Protocol):
    """Runs the admitted generations; the worker decides who is admitted and when."""

    @property
    def size(self) -> int:
        """Generations admitted and not finished (prefilling or decoding)."""
        ...

    @property
    def capacity(self) -> int:
        """The most generations it runs at once."""
        ...

    def admission(self, request: GenerationRequest) -> Admission: ...

    def add(
        self,
        key: Hashable,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        controller: ModeController | None = None,
    ) -> None: ...

    def step(self) -> list[tuple[Hashable, Outcome]]:
        """Advance every admitted generation by one step: each key's new events (ending in a
        FinishEvent when it finished) or the exception that ended it."""
        ...


class GeneratorBatcher:
    """Interleaves `engine.generate` generators, one event each per step. Interleaving computes
    nothing together, so by default it runs one generation at a time (`capacity` 1)."""

    def __init__(self, engine: Engine, capacity: int = 1) -> None:
        self.engine = engine
        self.capacity = capacity
        self._running: dict[Hashable, Iterator[EngineEvent]] = {}
        # Generators past their FinishEvent: run to their end (the controller's bookkeeping)
        # at the next step, after the event went out, as a plain loop over them would.
        self._closing: list[Iterator[EngineEvent]] = []

    @property
    def size(self) -> int:
        return len(self._running) + len(self._closing)

    def admission(self, request: GenerationRequest) -> Admission:
        return "now"  # one at a time: memory is the engine's own business, as before

    def add(
        self,
        key: Hashable,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        controller: ModeController | None = None,
    ) -> None:
        engine: Any = self.engine  # not every engine takes a controller
        events = (
            engine.generate(request, cancel)
            if controller is None
            else engine.generate(request, cancel, controller)
        )
        self._running[key] = iter(events)

    def step(self) -> list[tuple[Hashable, Outcome]]:
        out: list[tuple[Hashable, Outcome]] = []
        closing, self._closing = self._closing, []
        for done in closing:
            try:
                for _ in done:
                    pass
            except Exception as exc:  # its response is complete: only log it
                log.error("engine_finish_failed", error=repr(exc))
        for key, events in list(self._running.items()):
            try:
                event = next(events)
            except StopIteration:
                del self._running[key]
                continue
            except Exception as exc:
                del self._running[key]
                out.append((key, exc))
                continue
            if isinstance(event, FinishEvent):
                self._closing.append(self._running.pop(key))
            out.append((key, [event]))
        return out


def batcher_for(
    engine: Engine,
    max_batch: int,
    memory_limit: int | None = None,
    prefill_thread: bool | None = None,
) -> Batcher:
    """The engine's continuous batcher (capacity `max_batch`, `memory_limit` bytes for its
    sequences' caches, prompt chunks on a thread of their own per `prefill_thread`, None: its
    rule) when it has one and more than one sequence may run; else one `generate` at a
    time."""
    if max_batch > 1:
        from ..service import DFlashEngine  # noqa: PLC0415 (mlx: only once an engine exists)

        if isinstance(engine, DFlashEngine):
            from .batcher import EngineBatcher  # noqa: PLC0415

            return EngineBatcher(engine, max_batch, memory_limit, prefill_thread=prefill_thread)
    return GeneratorBatcher(engine)
