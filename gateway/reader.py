"""One reader over a job's engine events for every API dialect: it turns them into neutral
output pieces (text, reasoning and tool-call deltas with the log-probabilities of their tokens)
and, at the end, how the generation finished.

A dialect never reads engine events itself: it renders `Batch`es (streaming) or the fold of all
of them (`collect`), and the `Ending`. Streamed and complete responses are built from the same
pieces, so they always agree.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from toolflash.engine.api import Engine, FinishEvent, GenerationStats, TokenEvent, TokenLogprob
from toolflash.gateway.chat_output import (
    ChatOutput,
    ContentDelta,
    Delta,
    MessageFold,
    ToolCallReport,
)
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.structured import JsonAnswer
from toolflash.gateway.tool_parsers import get_parser
from toolflash.gateway.worker import Job, Prepared

# "tool_calls": at least one tool call parsed (never without one).
Finish = Literal["stop", "length", "tool_calls"]


class Output(Protocol):
    """Text in, deltas out (`ChatOutput` for templates, `TextOutput` for raw prompts)."""

    reports: list[ToolCallReport]
    rejected: list[dict[str, object]]
    stop_requested: bool

    @property
    def valid_calls(self) -> int: ...

    @property
    def can_stop(self) -> bool:
        """Whether its text can make it stop the generation (`stop_requested`)."""
        ...

    def feed(self, text: str) -> list[Delta]: ...

    def close(self) -> list[Delta]: ...

    def results(self) -> tuple[str, ...]: ...


class TextOutput:
    """A raw completion: every piece of text is content; no reasoning, no tool calls."""

    def __init__(self) -> None:
        self.reports: list[ToolCallReport] = []
        self.rejected: list[dict[str, object]] = []
        self.stop_requested = False

    @property
    def valid_calls(self) -> int:
        return 0

    @property
    def can_stop(self) -> bool:
        return False

    def feed(self, text: str) -> list[Delta]:
        return [ContentDelta(text)] if text else []

    def close(self) -> list[Delta]:
        return []

    def results(self) -> tuple[str, ...]:
        return ()


def output_for(req: ApiRequest, prepared: Prepared, engine: Engine) -> Output:
    """The assembler for a request: tool calls parsed when tools are offered; forced calls (and
    every call of a dialect that wants them whole) are held until they close (a call cut by
    max_tokens comes back as content, not half a call)."""
    conv = req.conversation
    if conv is None:
        return TextOutput()
    offered = conv.offered_tools is not None
    bound = prepared.request.constraint
    return ChatOutput(
        parser=get_parser(engine.tool_call_format) if offered else None,
        tools={t.name: t.parameters for t in conv.tools} if offered else {},
        start_in_reasoning=prepared.start_in_reasoning,
        parallel_tool_calls=conv.parallel_tool_calls,
        hold_calls=req.whole_tool_calls
        or (bound is not None and bound.kind == "tool_calls" and bound.require_call),
    )


def answer_for(req: ApiRequest, prepared: Prepared) -> JsonAnswer | None:
    """The final check of a constrained JSON answer, when the request asked for one."""
    bound = prepared.request.constraint
    if bound is None or bound.kind != "json":
        return None
    return JsonAnswer(bound, req.stop)


@dataclass(frozen=True)
class Batch:
    """The deltas completed by one batch of engine events, and the log-probabilities of the
    tokens received since the previous batch (when the request asked)."""

    deltas: list[Delta]
    logprobs: list[TokenLogprob]


@dataclass(frozen=True)
class Ending:
    """How the generation finished: `stop_sequence` is the client's stop string that ended
    it (None at EOS or any other end); `logprobs` those of tokens after the last batch."""

    finish_reason: Finish
    stop_sequence: str | None
    stats: GenerationStats
    logprobs: list[TokenLogprob]
    cancelled: bool  # by the client (not by us: parallel_tool_calls false stops after a call)


def finish_reason(engine_reason: str, valid_calls: int) -> Finish:
    """length wins (a call cut by max_tokens ends with "length"); "tool_calls" only when a call
    parsed; a cancel we issued (parallel_tool_calls false) also ends with "tool_calls"."""
    if engine_reason == "length":
        return "length"
    return "tool_calls" if valid_calls else "stop"


def matched_stop(full_text: str, shown: int, stops: Sequence[str]) -> str | None:
    """The stop string that ended a generation whose tokens decode to `full_text`, of which the
    first `shown` characters were returned (the engine cuts the text right before the stop
    string): the one found earliest from there; None if none is (an EOS ended it)."""
    start = max(0, shown - max((len(s) for s in stops), default=0))
    found = [(i, -len(s), s) for s in stops if s and (i := full_text.find(s, start)) >= 0]
    return min(found)[2] if found else None


class EventReader:
    """Reads one job's events; `ending` is set once `batches()` is exhausted. `decode` (the
    engine's) names the stop string that ended a generation. `read_interval_s` paces the reads
    (`Job.batches`): 0 reads every batch of events as soon as it is ready (streams), `math.inf`
    reads the rest at the end (a complete response whose output cannot stop the generation)."""

    def __init__(
        self,
        job: Job,
        output: Output,
        answer: JsonAnswer | None = None,
        *,
        stops: tuple[str, ...] = (),
        decode: Callable[[Sequence[int]], str] | None = None,
        read_interval_s: float = 0.0,
    ) -> None:
        self.job = job
        self.output = output
        self.answer = answer
        self.stops = stops
        self._decode = decode
        self._interval = read_interval_s
        self.ending: Ending | None = None
        self._pending: list[TokenLogprob] = []
        self._ids: list[int] = []
        self._shown = 0  # characters of text the engine returned

    async def batches(self) -> AsyncIterator[Batch]:
        """Engine events -> batches of deltas, one per batch of events read together
        (`Job.batches`: at most one batch per `read_interval_s`)."""
        output, answer = self.output, self.answer
        async for events in self.job.batches(self._interval):
            deltas: list[Delta] = []
            tokens = [e for e in events if isinstance(e, TokenEvent)]
            if tokens:
                text = ""
                for e in tokens:
                    self._pending.extend(e.logprobs)
                    if self.stops:
                        self._ids.extend(e.token_ids)
                    text += e.text
                self._shown += len(text)
                deltas = output.feed(text)
                if output.stop_requested:
                    self.job.cancel.set()  # parallel_tool_calls false: one call, then stop
                if answer is not None:
                    answer.add(deltas)
            event = events[-1]
            if isinstance(event, FinishEvent):
                closing = output.close()
                deltas += closing
                reason = finish_reason(event.finish_reason, output.valid_calls)
                if answer is not None:
                    answer.add(closing)
                ending = Ending(
                    reason,
                    self._stop_sequence(event.finish_reason),
                    event.stats,
                    [],
                    event.finish_reason == "cancelled" and not output.stop_requested,
                )
                self.ending = ending
                if answer is not None:
                    failed = answer.finish(reason, output.valid_calls)
                    if failed is not None:
                        raise failed
            if deltas:
                yield Batch(deltas, self._take())
        assert self.ending is not None
        self.ending.logprobs.extend(self._take())

    def _take(self) -> list[TokenLogprob]:
        out, self._pending = self._pending, []
        return out

    def _stop_sequence(self, engine_reason: str) -> str | None:
        if engine_reason != "stop" or not self.stops or self._decode is None:
            return None
        return matched_stop(self._decode(self._ids), self._shown, self.stops)


@dataclass(frozen=True)
class Collected:
    """A whole generation's pieces, for a complete (non-streaming) response."""

    deltas: list[Delta]
    logprobs: list[TokenLogprob]
    ending: Ending

    def message(self) -> MessageFold:
        fold = MessageFold()
        fold.add(self.deltas)
        return fold


async def collect(reader: EventReader) -> Collected:
    deltas: list[Delta] = []
    logprobs: list[TokenLogprob] = []
    async for batch in reader.batches():
        deltas += batch.deltas
        logprobs += batch.logprobs
    assert reader.ending is not None
    return Collected(deltas, logprobs + reader.ending.logprobs, reader.ending)
