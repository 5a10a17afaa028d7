"""Continuous batching over one `DFlashEngine`: requests join at step boundaries, leave the
moment they finish, and every running sequence advances once per scheduler step.

One `step` = one decode step for every running sequence + one prefill chunk of the oldest
request still prefilling (so a long prompt never stalls the running streams for longer than a
chunk). With a prefill thread (`prefill_in_thread`), the chunk is computed there while the
running sequences go on decoding, and a step collects it once it is done. A decode step: alone,
the sequence runs the full policy (spec cycles or AR, as `generate` does); with two or more,
one batched forward advances them all (`decode_rule`: a batched verify where every row wants
speculation and the band rule measured it faster, else a batched AR step, whose next forward is
queued before the rows commit on a GPU). A batched sequence's caches are rows of `BatchRows`;
it gets them back (`extract`) when it runs alone again or finishes (the prefix cache publishes
from its own caches).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import structlog

from ..api import EngineEvent, GenerationRequest, Mode, ModeController, TokenEvent
from ..choosers import Proposal
from ..host import host_ints
from ..lane import Lane
from ..service import DFlashEngine
from ..targets.base import ForwardResult
from ..targets.pipeline import PipelineTarget
from .api import Admission, Outcome, usable_cores
from .band_rule import BandRule, BatchKind
from .drafts import dflash_logits, shares_drafter
from .memory import (
    MemoryBudget,
    default_budget_bytes,
    memory_bytes,
    sequence_cost,
    weights_bytes,
)
from .rows import BatchRows
from .verify import rollback_rows

log = structlog.get_logger(__name__)


def decode_rule(running: int, modes: Sequence[Mode], batch_kind: Callable[[int], BatchKind]) -> str:
    """How `running` decoding sequences advance this step: one alone keeps the request's full
    policy (spec, lookup or AR cycles); two or more share one target forward: when every row's
    mode is spec, `batch_kind(running)` says whether that is a batched verify of each row's
    own draft ("batched_spec") or a batched AR step; otherwise one batched AR step."""
    if running == 1:
        return "solo"
    if modes and all(m == "spec" for m in modes):
        return batch_kind(running)
    return "batched_ar"


def fixed_kind(spec_rows: int) -> Callable[[int], BatchKind]:
    """A batched verify for up to `spec_rows` rows, batched AR steps past it."""
    return lambda rows: "batched_spec" if rows <= spec_rows else "batched_ar"


def prefill_in_thread(device: str, cores: int, pipeline: bool) -> bool:
    """Whether prompt chunks are computed on a thread of their own, beside the decode steps,
    by default (`serve --prefill-thread on|off` overrides it). A chunk takes a core for tens of
    milliseconds, in which the running sequences take several decode steps on another: on a
    CPU with four cores or more. With two, the server's event loop and its clients need the
    second core: over HTTP 4 / 8 clients ran ~10% slower with the thread on the 2-core machine
    (`benchmarks/concurrent_clients.py --serial-args "--prefill-thread off"`), though a stream
    beside a long prefill kept decoding (`benchmarks/prefill_stall.py`). Not on a GPU, where it
    is not measured yet, nor for a pipeline target, whose ranks take one forward at a time."""
    return device == "cpu" and cores >= 4 and not pipeline


def queue_ahead_on(device: str) -> bool:
    """Whether batched AR steps queue the next step's forward before the rows commit. Not on
    a CPU: there the step is its forward (the host's part is small), so queueing ahead saved
    nothing in steady state (`benchmarks/batch_step.py`), while every row that joins or ends
    throws a queued forward away. On a GPU the forward is short beside the host's graph
    building and commits, which is what queueing ahead hides (as `generate_step` and
    mlx-lm's `BatchGenerator` do)."""
    return device != "cpu"


def _row(staged: int, draft: mx.array, width: int) -> mx.array:
    """A verify row: the staged token, the draft, zeros up to `width` (rows past a row's own
    draft are computed and never read)."""
    parts = [mx.array([staged], dtype=mx.int32), draft.astype(mx.int32)]
    if width - 1 - int(draft.shape[0]) > 0:
        parts.append(mx.zeros((width - 1 - int(draft.shape[0]),), dtype=mx.int32))
    return mx.concatenate(parts)


def _proposals(lanes: Sequence[Lane]) -> list[Proposal]:
    """Each row's proposal for a batched verify, its evaluation started: forced tokens or a
    lookup takeover where the row has one, else the drafter's block, rows drafting the same
    block size in one drafter forward (`drafts.dflash_logits`) where they share a drafter."""
    proposals: list[Proposal | None] = [lane.copied_proposal() for lane in lanes]
    drafting: dict[int, list[int]] = {}
    for i, p in enumerate(proposals):
        if p is None:
            drafting.setdefault(lanes[i].block, []).append(i)
    for block, rows in drafting.items():
        sessions = [lanes[i].session for i in rows]
        if len(rows) > 1 and shares_drafter(sessions):
            logits = dflash_logits(sessions, block)
            for j, i in enumerate(rows):
                proposals[i] = lanes[i].draft(logits[j])
        else:
            for i in rows:
                proposals[i] = lanes[i].draft()
    done = cast(list[Proposal], proposals)  # every row has one now
    mx.async_eval([p.tokens for p in done])
    return done


@dataclass
class _Ahead:
    """A batched AR forward queued before the step that feeds it commits (its input is that
    step's still-lazy choices): the rows it was queued for, its result (tape kept, so `undo`
    can take it back), and each row's next choice, lazy."""

    keys: tuple[Hashable, ...]
    result: ForwardResult
    choices: list[mx.array]


@dataclass
class _Entry:
    key: Hashable
    lane: Lane
    row: bool = False  # its caches are a row of the batch


class EngineBatcher:
    """The running batch of one engine (used on the engine's own thread only)."""

    def __init__(
        self,
        engine: DFlashEngine,
        capacity: int = 8,
        memory_limit: int | None = None,
        spec_rows: int | None = None,
        prefill_thread: bool | None = None,
        queue_ahead: bool | None = None,
    ) -> None:
        self.engine = engine
        # Batched verify or batched AR for rows that all want speculation: learnt per batch
        # size band (`BandRule`), or fixed up to `spec_rows` rows.
        self.band_rule = BandRule()
        self._batch_kind = fixed_kind(spec_rows) if spec_rows is not None else self.band_rule.choose
        device = mx.default_device().type.name  # "cpu" or "gpu"
        if prefill_thread is None:
            pipeline = isinstance(engine.target, PipelineTarget)
            prefill_thread = prefill_in_thread(device, usable_cores(), pipeline)
        self.queue_ahead = queue_ahead_on(device) if queue_ahead is None else queue_ahead
        self._thread = (
            ThreadPoolExecutor(1, thread_name_prefix="toolflash-prefill")
            if prefill_thread
            else None
        )
        # The chunk under way on the prefill thread: its lane is the thread's until it is done.
        self._chunk: tuple[_Entry, Future[None]] | None = None
        self.capacity = capacity  # sequences admitted at once (the worker enforces it)
        weights = weights_bytes(engine.target.model)
        if memory_limit is None:
            memory_limit = default_budget_bytes(weights, memory_bytes(dict(mx.device_info())))
        self.budget = MemoryBudget(sequence_cost(engine.target), memory_limit)
        self.rows = BatchRows(engine.target)
        self.capture = engine.drafter.config.target_layer_ids if engine.drafter else ()
        # The next batched AR forward, queued ahead (`_batched`); undone before the rows change.
        self._ahead: _Ahead | None = None
        self.prefilling: list[_Entry] = []
        # Rows first, in row order; a sequence that just finished prefill after them.
        self.running: list[_Entry] = []

    @property
    def size(self) -> int:
        return len(self.prefilling) + len(self.running)

    @property
    def decoding(self) -> int:
        return len(self.running)

    def _tokens(self, request: GenerationRequest) -> int:
        """The most tokens `request` may hold: its prompt and all of its output."""
        prompt = len(request.prompt_tokens)
        return min(prompt + request.max_tokens, self.engine.context_length)

    def admission(self, request: GenerationRequest) -> Admission:
        """Whether `request` fits the memory budget now, later (once others finish) or never."""
        tokens = self._tokens(request)
        if self.budget.fits(tokens):
            return "now"
        return "wait" if self.budget.ever_fits(tokens) else "never"

    def add(
        self,
        key: Hashable,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        controller: ModeController | None = None,
    ) -> None:
        """Queue `request` for prefill (raises what the engine refuses, e.g. a prompt longer
        than the context)."""
        self.prefilling.append(_Entry(key, Lane(self.engine, request, cancel, controller)))
        self.budget.reserve(key, self._tokens(request))

    def step(self) -> list[tuple[Hashable, Outcome]]:
        """One scheduler step; each key's events (a list ending in a FinishEvent when that
        generation ended, or the exception that ended it)."""
        out: list[tuple[Hashable, Outcome]] = []
        busy = self._chunk[0] if self._chunk is not None else None
        gone = [e for e in self.prefilling + self.running if e.lane.cancelled and e is not busy]
        out.extend(self._retire(gone, lambda e: e.lane.abort()))
        for entry in [e for e in self.running if e.lane.solo_only]:
            out.extend(self._solo(entry))
        batchable = [e for e in self.running if not e.lane.solo_only]
        if len(batchable) == 1:
            out.extend(self._solo(batchable[0]))
        elif batchable:
            out.extend(self._batched())
        # The chunk after the decode step: a request's first token goes out the step its
        # prefill ends, not after a decode step it could have waited for.
        if self.prefilling:
            out.extend(self._prefill_next())
        return out

    def _prefill_next(self) -> list[tuple[Hashable, Outcome]]:
        """Prefill work for this step. With a prefill thread: collect the chunk under way once
        it is done (waiting for it only when nothing decodes), commit the first token of a
        prompt it completed, and start the next chunk there. Without one (or for a sparse
        prefill, or a prompt the cache held whole): the oldest request's next chunk, here."""
        out: list[tuple[Hashable, Outcome]] = []
        if self._chunk is not None:
            entry, chunk = self._chunk
            if self.running and not chunk.done():
                return []
            self._chunk = None
            try:
                chunk.result()
            except Exception as exc:
                return self._fail([entry], exc)
            if entry.lane.fed and not entry.lane.cancelled:
                out = self._prefill(entry)  # its first token, here
        if not self.prefilling:
            return out
        entry = self.prefilling[0]
        if entry.lane.cancelled:
            return out  # it ends at the next step
        if self._thread is not None and not entry.lane.solo_only and not entry.lane.fed:
            entry.lane.session.settle()  # what this thread made (a restored state) is computed
            self._chunk = (entry, self._thread.submit(entry.lane.feed_next, True))
            return out
        return out or self._prefill(entry)

    def _prefill(self, entry: _Entry) -> list[tuple[Hashable, Outcome]]:
        try:
            # Alone once prefilled (nothing else running or waiting): prepare its first step.
            alone = not self.running and len(self.prefilling) == 1
            events = list(entry.lane.prefill_step(prepare=alone))
        except Exception as exc:
            return self._fail([entry], exc)
        if entry.lane.done:
            self.prefilling.remove(entry)
            self.budget.release(entry.key)
        elif entry.lane.prefilled:
            self.prefilling.remove(entry)
            self.running.append(entry)
        return [(entry.key, events)] if events else []

    def _solo(self, entry: _Entry) -> list[tuple[Hashable, Outcome]]:
        if entry.row:  # the batch shrank to this one: its caches become its own again
            self._undo_ahead()
            entry.lane.session.cache = self.rows.extract(0)
            self.rows.keep([])
            entry.row = False
        try:
            events = list(entry.lane.solo_step(prepare=not self.prefilling))
        except Exception as exc:
            return self._fail([entry], exc)
        if entry.lane.done:
            self.running.remove(entry)
            self.budget.release(entry.key)
        return [(entry.key, events)]

    def _batched(self) -> list[tuple[Hashable, Outcome]]:
        rowed = [e for e in self.running if e.row]
        alone = [e for e in self.running if e.lane.solo_only]  # stepped by `step` itself
        for entry in self.running:
            if not entry.row and not entry.lane.solo_only:
                self._undo_ahead()
                entry.lane.leave_solo()
                self.rows.admit(entry.lane.session.cache)
                entry.lane.session.cache = []  # the batch holds its state now
                entry.row = True
                rowed.append(entry)
        entries = rowed  # row order
        self.running = [*rowed, *alone]
        lanes = [e.lane for e in entries]
        modes = [lane.batch_mode() for lane in lanes]
        t0 = time.perf_counter()
        if decode_rule(len(lanes), modes, self._batch_kind) == "batched_spec":
            self._undo_ahead()
            return self._recorded("batched_spec", len(lanes), t0, self._batched_spec(entries))
        keys = tuple(e.key for e in entries)
        try:
            ahead = self._ahead if self._ahead is not None and self._ahead.keys == keys else None
            if ahead is None:
                self._undo_ahead()
                res = self.rows.forward([lane.session.staged for lane in lanes], self.capture)
                choices = [lane.choice(res.logits[i, -1]) for i, lane in enumerate(lanes)]
            else:
                self._ahead = None
                res, choices = ahead.result, list(ahead.choices)
            self._queue_ahead(keys, lanes, choices)
            lazy = [c for c in choices if isinstance(c, mx.array)]
            values = iter(host_ints(mx.stack(lazy)) if lazy else [])  # the step's one host sync
            tokens = [c if isinstance(c, int) else next(values) for c in choices]
            step_s = time.perf_counter() - t0
        except Exception as exc:
            return self._fail(entries, exc)
        logits = res.logits[:, -1]
        committed = self._commit_rows(
            entries,
            lambda i, lane: lane.commit_row(
                tokens[i],
                logits[i],
                res.features[i : i + 1] if res.features is not None else None,
                step_s,
                len(lanes),
            ),
        )
        return self._recorded("batched_ar", len(lanes), t0, committed)

    def _recorded(
        self, kind: BatchKind, rows: int, t0: float, out: list[tuple[Hashable, Outcome]]
    ) -> list[tuple[Hashable, Outcome]]:
        """`out`, the outcomes of a batched step over `rows` rows, once its committed tokens
        and wall time (from `t0`) went to the band rule."""
        tokens = sum(
            len(e.token_ids)
            for _, events in out
            if not isinstance(events, BaseException)
            for e in events
            if isinstance(e, TokenEvent)
        )
        self.band_rule.record(rows, kind, tokens, time.perf_counter() - t0)
        return out

    def _queue_ahead(
        self, keys: tuple[Hashable, ...], lanes: list[Lane], choices: Sequence[mx.array | int]
    ) -> None:
        """Queue the next batched AR forward on this step's lazy choices before the host reads
        them, as an AR step alone does, so the device runs on while the rows commit. Only
        where every row chooses on the device, none follows its output and none is at its
        last token; a step that finds the rows changed (a row ended or joined, a mode
        switched) takes it back."""
        if not self.queue_ahead or not all(isinstance(c, mx.array) for c in choices):
            return
        if any(lane.matcher.remaining <= 1 for lane in lanes):
            return
        # A row whose processors follow the output chose this token on the device (its masks
        # were known) but cannot choose the next one before this one is read.
        if any(lane.session.chooser.follows_output for lane in lanes):
            return
        res = self.rows.forward(list(choices), self.capture, keep_tape=True)
        ready = [
            cast(mx.array, lane.choice_after_next(res.logits[i, -1]))
            for i, lane in enumerate(lanes)
        ]
        mx.async_eval(ready)
        self._ahead = _Ahead(keys, res, ready)

    def _undo_ahead(self) -> None:
        """Take back the queued forward (before the rows change, or when it is not used)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self.rows.undo(ahead.result)

    def _commit_rows(
        self, entries: list[_Entry], commit: Callable[[int, Lane], list[EngineEvent]]
    ) -> list[tuple[Hashable, Outcome]]:
        """Commit each row's step (`commit(i, lane)`); rows whose generation ended leave."""
        out: list[tuple[Hashable, Outcome]] = []
        finished: list[int] = []
        for i, entry in enumerate(entries):
            lane = entry.lane
            # A lane that ends here takes its row back first (it publishes from its own).
            lane.reclaim = lambda i=i: self._reclaim(i)
            try:
                events: Outcome = commit(i, lane)
            except Exception as exc:
                events = exc
                lane.release()
            lane.reclaim = None
            out.append((entry.key, events))
            if lane.done or isinstance(events, BaseException):
                finished.append(i)
        if finished:
            alone = [e for e in self.running if e not in entries]
            for i in finished:
                self.budget.release(entries[i].key)
            self._undo_ahead()
            self.rows.keep([i for i in range(len(entries)) if i not in finished])
            self.running = [e for i, e in enumerate(entries) if i not in finished] + alone
        return out

    def _reclaim(self, row: int) -> list[Any]:
        """Row `row`'s caches for its lane, which ends (the queued forward taken back first)."""
        self._undo_ahead()
        return self.rows.extract(row)

    def _batched_spec(self, entries: list[_Entry]) -> list[tuple[Hashable, Outcome]]:
        """One speculative cycle for every row: each drafts its own block (its own drafter
        context), one target forward verifies all blocks (padded to the longest), each row
        keeps its own accepted prefix (`rollback_rows`)."""
        lanes = [e.lane for e in entries]
        try:
            t0 = time.perf_counter()
            proposals = _proposals(lanes)
            width = 1 + max(int(p.tokens.shape[0]) for p in proposals)
            block = mx.stack(
                [_row(lane.session.staged, p.tokens, width) for lane, p in zip(lanes, proposals)]
            )
            res = self.rows.verify(block, self.capture)
            t1 = time.perf_counter()
            judged = [
                lane.judge(p, res.logits[i, : int(p.tokens.shape[0]) + 1])
                for i, (lane, p) in enumerate(zip(lanes, proposals))
            ]
            t2 = time.perf_counter()
            keeps = [min(acc, len(toks) - 1) + 1 for toks, acc, _ in judged]
            rollback_rows(self.rows.layers or [], res, keeps)
            times = (t1 - t0, t2 - t1, time.perf_counter() - t2)
        except Exception as exc:
            return self._fail(entries, exc)
        return self._commit_rows(
            entries,
            lambda i, lane: lane.commit_block(
                proposals[i],
                judged[i],
                res.logits[i, : int(proposals[i].tokens.shape[0]) + 1],
                res.features[i : i + 1] if res.features is not None else None,
                times,
                len(lanes),
            ),
        )

    def _retire(self, entries: list[_Entry], end: object) -> list[tuple[Hashable, Outcome]]:
        out: list[tuple[Hashable, Outcome]] = []
        for entry in entries:
            self._detach(entry)
            try:
                out.append((entry.key, end(entry)))  # type: ignore[operator]
            except Exception as exc:
                entry.lane.release()
                out.append((entry.key, exc))
        return out

    def _fail(self, entries: list[_Entry], exc: BaseException) -> list[tuple[Hashable, Outcome]]:
        log.error("batch_step_failed", rows=len(entries), error=repr(exc))
        if any(e.row for e in entries):  # a batched step failed: its rows' state goes with them
            self._ahead = None
        for entry in entries:
            self._detach(entry)
            entry.lane.release()
        return [(entry.key, exc) for entry in entries]

    def _detach(self, entry: _Entry) -> None:
        """Take `entry` out of the batch (its caches back to it, its row dropped)."""
        self.budget.release(entry.key)
        if entry in self.prefilling:
            self.prefilling.remove(entry)
        if entry in self.running:
            if entry.row:
                self._undo_ahead()
                rows = [e for e in self.running if e.row]
                i = rows.index(entry)
                entry.lane.session.cache = self.rows.extract(i)
                self.rows.keep([j for j in range(len(rows)) if j != i])
                entry.row = False
            self.running.remove(entry)
