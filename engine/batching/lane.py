"""One request inside the batch scheduler: `DFlashEngine.generate`'s loop, cut at step
boundaries so a scheduler can interleave requests.

A lane prefills one chunk per call (`prefill_step`), then decodes either alone (`solo_step`:
`GenerationSession.step` under the policy's mode and block, exactly as the engine's loop) or as
one row of a batched AR step (`commit_row`: the token the scheduler's batched forward chose for
it). Both commit through the same stop matcher, text tracker, prefix cache and stats, so a
sequence's events are those of `generate`; only which forward computed a token differs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import mlx.core as mx

from toolflash.cache.state import SessionState

from ..api import (
    ContextLengthError,
    CycleRecord,
    EngineEvent,
    FinishEvent,
    GenerationRequest,
    GenerationStats,
    Mode,
    ModeController,
    TokenEvent,
)
from ..choosers import build_chooser
from ..draft_length import DraftLengthSchedule, scheduled_block
from ..sampling.logprobs import token_logprobs
from ..selection import Proposal
from ..service import CLEAR_CACHE_EVERY, DFlashEngine
from ..session import GenerationSession, StepResult
from ..stops import StopMatcher
from ..text import TextTracker


class Lane:
    """A request's generation, advanced one scheduler step at a time."""

    def __init__(
        self,
        engine: DFlashEngine,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        controller: ModeController | None = None,
    ) -> None:
        prompt = list(request.prompt_tokens)
        if not prompt or len(prompt) >= engine.context_length:
            raise ContextLengthError(len(prompt), request.max_tokens, engine.context_length)
        self.engine = engine
        self.request = request
        self.cancel = cancel
        self.prompt = prompt
        self.controller = controller
        self.mode: Mode = self._runnable(request.mode)
        spec_block = request.block_size or engine.default_block_size
        lookup_block = request.block_size or engine.options.lookup.block_size
        self.block_size = lookup_block if self.mode == "lookup" else spec_block
        # The arms a controller may choose from: spec up to the drafter's block (0: none),
        # lookup at its block (as the engine's own loop).
        self.arm_blocks = (spec_block if engine.drafter is not None else 0, lookup_block)
        adaptive = (request.draft_length or engine.options.draft_length) == "adaptive"
        self.schedule = DraftLengthSchedule(self.block_size) if adaptive else None
        self.session = GenerationSession(
            engine.target,
            engine.drafter,
            window=engine.options.window,
            prefill_chunk=engine.options.prefill_chunk,
            chooser=build_chooser(request, engine.target.vocab_size, engine.tokenizer),
            logprobs=request.logprobs,
            lookup=engine.options.lookup,
        )
        eos_ids = frozenset() if request.ignore_eos else engine.eos_ids
        max_tokens = min(request.max_tokens, engine.context_length - len(prompt))
        self.matcher = StopMatcher(
            eos_ids | request.stop_token_ids, request.stop_strings, max_tokens, engine.decode
        )
        self.text = TextTracker(engine.decode, request.stop_strings, self.matcher.eos_ids)
        self.cycles: list[CycleRecord] = []
        self.cache = engine.prefix_cache
        if self.cache is not None:
            self.cache.request_started()
        self.t0 = time.perf_counter()
        hit = self.cache.lookup(engine.cache_key, prompt) if self.cache is not None else None
        self.restored = len(hit.snapshot.tokens) if hit is not None else 0
        # Opt-in sparse prefill: its chunks are fed in one scheduler step, and the session
        # never becomes a batch row (rows rotate at their cache length, a sparse session at
        # its true positions).
        self.selection = engine._sparse_selection(request, prompt, self.restored)
        if hit is not None:
            self.session.load_state(hit.snapshot.state)
        self._pos = self.restored
        self._publish_at = sorted(
            {p for p in request.publish_at if self.restored < p <= len(prompt)}
            if self.cache is not None
            else set()
        )
        self._deferred: list[SessionState] = []
        self._prepared: Future[None] | None = (
            engine._submit(self.controller.prepare, len(prompt), *self.arm_blocks)
            if self.controller is not None
            else None
        )
        self.prefill_s = 0.0
        self.t_decode = 0.0
        self.decode_s = 0.0
        self.done = False
        self.prefilled = False
        # Set by the scheduler while the caches are a batch row: returns them as this
        # session's own (called before the end publishes the state).
        self.reclaim: Callable[[], list[Any]] | None = None
        self._asked = 0  # the block asked for by the last `propose`
        self._prepare_first = False

    # -- prefill -----------------------------------------------------------------------
    def prefill_step(self, prepare: bool = False) -> list[EngineEvent]:
        """Feed the next prompt chunk; after the last one, commit the first token and return
        its event (and the finish, when that token ends the generation). With `prepare` (the
        lane will decode alone), the first step's device work starts before the event goes
        out, as in the engine's loop."""
        self._prepare_first = prepare
        session = self.session
        if self._pos >= len(self.prompt):  # the prefix cache held all of it
            return self._first()
        if self.selection is not None:
            publish_at, self._publish_at = self._publish_at, []
            session.sparse_feed(
                self.prompt, self.selection, self.restored, publish_at, self._deferred.append
            )
            return self._first()
        stop = self._publish_at[0] if self._publish_at else len(self.prompt)
        end = min(self._pos + session.prefill_chunk, stop)
        session._prefill_chunk(self.prompt[self._pos : end])
        self._pos = end
        if self._publish_at and end == self._publish_at[0]:
            self._publish_at.pop(0)
            self._deferred.append(session.export_state())
        if end < len(self.prompt):
            return []
        return self._first()

    def _first(self) -> list[EngineEvent]:
        session, engine = self.session, self.engine
        first = session._commit_first(self.prompt)
        self.prefilled = True
        if self.cache is not None:
            self.cache.record_prefill(self.restored, session.computed_prompt_tokens)
        self.prefill_s = time.perf_counter() - self.t0
        self.t_decode = time.perf_counter()
        finished = self.matcher.check([first]) is not None
        first_text = self.text.push([first])
        if self.controller is not None and self._prepared is not None:
            self._prepared.result()
            self.controller.observe_prefix(first_text or engine.decode([first]))
            decision = self.controller.start(len(self.prompt), *self.arm_blocks)
            self.mode, self.block_size = decision.mode, decision.block_size
        events: list[EngineEvent] = [
            TokenEvent((first,), first_text, None, engine._logprobs(session.first_logprobs))
        ]
        for state in self._deferred:
            assert self.cache is not None
            self.cache.publish(engine.cache_key, state)
        self._deferred = []
        if finished or self.text.stopped:
            events.extend(self._end(None))
        elif self._prepare_first:
            block = min(scheduled_block(self.schedule, self.block_size), self.matcher.remaining)
            session.prepare(self.next_mode(), block)
        return events

    # -- decode ------------------------------------------------------------------------
    @property
    def solo_only(self) -> bool:
        """Whether this lane must decode alone (a sparse session is never a batch row)."""
        return self.selection is not None

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def next_mode(self) -> Mode:
        return self._runnable(self.request.mode_plan.get(len(self.cycles), self.mode))

    def batch_mode(self) -> Mode:
        """What this row does in a batched step: "spec" where its mode is spec with a block to
        draft, else "ar" (lookup, AR, or a last token)."""
        block = min(scheduled_block(self.schedule, self.block_size), self.matcher.remaining)
        spec = self.next_mode() == "spec" and block > 1 and self.session.draft_ctx is not None
        return "spec" if spec else "ar"

    def solo_step(self, prepare: bool) -> list[EngineEvent]:
        """One cycle or AR step alone, under the policy's mode and block (the engine's own
        loop); with `prepare`, the next step's device work starts before the event goes out
        (only where the next step is expected to run alone too)."""
        if self.cancelled:
            return self._end("cancelled")
        remaining = self.matcher.remaining
        block = min(scheduled_block(self.schedule, self.block_size), remaining)
        mode = self.next_mode()
        # An AR step (or a lookup step that finds no match) queues the next one's forward.
        lookahead = prepare and mode != "spec" and remaining > 1
        step = self.session.step(mode, block, self.matcher.check, lookahead)
        return self._after(step, solo=True, prepare=prepare)

    def leave_solo(self) -> None:
        """Undo what a solo step queued ahead before the session's cache joins a batch: an AR
        forward (`drain`) and a draft started early (made for a state the batch moves on from;
        the session keeps no public way to drop it)."""
        self.session.drain()
        self.session._prepared = None

    def choice(self, logits: mx.array) -> mx.array | int:
        """The next token from this row's logits [V]: left on the device where the chooser
        can (greedy, sampled), else chosen on the host (processors that follow the output)."""
        lazy = self.session.chooser.choice_ahead(logits, 0)
        return lazy if lazy is not None else self.session.chooser.choose(logits)

    def commit_row(
        self, token: int, logits: mx.array, features: mx.array | None, step_s: float, rows: int
    ) -> list[EngineEvent]:
        """Commit the token a batched AR step chose for this row (the staged token was fed
        there): what `GenerationSession`'s AR step commits, in the same order."""
        session = self.session
        session.last_logits = logits
        if session.draft_ctx is not None and features is not None:
            session.draft_ctx.add_features(features)
        session.fed += 1
        end = self.matcher.check([token])
        session.tokens.append(token)
        session.chooser.commit([token])
        logprobs = (
            token_logprobs(logits[None], [token], session.logprobs)
            if session.logprobs is not None
            else []
        )
        record = CycleRecord(
            index=session.cycles,
            mode="ar",
            block_size=1,
            drafted=0,
            accepted=0,
            committed=1,
            draft_s=0.0,
            verify_s=step_s,
            rollback_s=0.0,
            context_len=session.fed,
            rows=rows,
        )
        session.cycles += 1
        return self._after(StepResult([token], record, end is not None, logprobs), solo=False)

    def propose(self) -> Proposal:
        """This row's proposal for a batched verify: tokens a constraint forces, else the
        drafter's block (the drafter context is the lane's own; no target cache is read)."""
        session = self.session
        block = min(scheduled_block(self.schedule, self.block_size), self.matcher.remaining)
        proposal = session.chooser.forced(block - 1)
        if proposal is None:
            proposal = session.chooser.draft(session.proposer(session, block)[0])
        mx.async_eval(proposal.tokens)
        self._asked = block
        return proposal

    def judge(self, proposal: Proposal, logits: mx.array) -> tuple[list[int], int, bool]:
        """Verify `proposal` against this row's verify logits [d+1, V]: the tokens to
        commit (cut at a stop), how many drafted ones were accepted, whether it ends here."""
        verdict = self.session.chooser.verify(proposal, logits)
        committed = verdict.tokens
        end = self.matcher.check(committed)
        if end is not None:
            committed = committed[: end + 1]
        return committed, verdict.accepted, end is not None

    def commit_block(
        self,
        proposal: Proposal,
        judged: tuple[list[int], int, bool],
        logits: mx.array,
        features: mx.array | None,
        times: tuple[float, float, float],
        rows: int,
    ) -> list[EngineEvent]:
        """Commit a judged block (its K/V and recurrent state already rolled back to `keep`
        rows by the scheduler): what the session's spec cycle commits, in the same order."""
        session = self.session
        committed, accepted, finished = judged
        keep = min(accepted, len(committed) - 1) + 1
        session.last_logits = logits[keep - 1]
        if session.draft_ctx is not None and features is not None:
            session.draft_ctx.add_features(features[:, :keep])
        session.fed += keep
        session.tokens.extend(committed)
        session.chooser.commit(committed)
        logprobs = (
            token_logprobs(logits, committed, session.logprobs)
            if session.logprobs is not None
            else []
        )
        drafted = int(proposal.tokens.shape[0])
        record = CycleRecord(
            index=session.cycles,
            mode="spec",
            block_size=drafted + 1,
            drafted=drafted,
            accepted=accepted,
            committed=len(committed),
            draft_s=times[0],
            verify_s=times[1],
            rollback_s=times[2],
            context_len=session.fed,
            forced=drafted if proposal.forced else 0,
            draft_cut=not proposal.forced and drafted < self._asked - 1,
            rows=rows,
        )
        session.cycles += 1
        return self._after(StepResult(committed, record, finished, logprobs), solo=False)

    def _after(self, step: StepResult, solo: bool, prepare: bool = False) -> list[EngineEvent]:
        self.cycles.append(step.record)
        if self.schedule is not None:
            self.schedule.observe(step.record)
        delta = self.text.push(step.tokens)
        # Batched steps are not the policy's to judge: their cost is the batch's, and the
        # surplus it learns is per request running alone.
        if solo and self.controller is not None:
            decision = self.controller.after_step(step.record, step.tokens, delta)
            self.mode, self.block_size = decision.mode, decision.block_size
        ends = step.finished or self.text.stopped
        if solo and prepare and not ends:
            block = min(scheduled_block(self.schedule, self.block_size), self.matcher.remaining)
            self.session.prepare(self.next_mode(), block)
        engine = self.engine
        events: list[EngineEvent] = [
            TokenEvent(tuple(step.tokens), delta, step.record, engine._logprobs(step.logprobs))
        ]
        if len(self.session.tokens) % CLEAR_CACHE_EVERY < len(step.tokens):
            mx.clear_cache()
        if ends:
            events.extend(self._end(None))
        return events

    def _end(self, reason: str | None) -> list[EngineEvent]:
        """The tail text, the prefix-cache publication and the `FinishEvent` (the session's
        cache must be its own again: the scheduler extracts a batched row first)."""
        if self.done:
            return []
        self.done = True
        if self.reclaim is not None:
            self.session.cache, self.reclaim = self.reclaim(), None
        self.session.drain()
        self.decode_s = time.perf_counter() - self.t_decode if self.prefilled else 0.0
        if reason is None:
            reason = "stop" if self.text.stopped else (self.matcher.reason or "length")
        events: list[EngineEvent] = []
        tail = self.text.flush()
        if tail:
            events.append(TokenEvent((), tail))
        sparse = self.session.lineage == "sparse"  # never reusable: not published
        if self.cache is not None and self.prefilled and self.session.fed > 0 and not sparse:
            self.cache.publish(self.engine.cache_key, self.session.export_state())
        stats = GenerationStats(
            prompt_tokens=len(self.prompt),
            cached_tokens=self.restored,
            completion_tokens=len(self.matcher.emitted),
            prefill_s=self.prefill_s,
            decode_s=self.decode_s,
            cycles=tuple(self.cycles),
            constraint=self.session.chooser.stats(),
            computed_tokens=self.session.computed_prompt_tokens,
            sparse=sparse,
        )
        events.append(FinishEvent(reason, stats))  # type: ignore[arg-type]
        self.release()
        if self.controller is not None and self.prefilled:
            self.controller.finish(stats)
        return events

    def abort(self) -> list[EngineEvent]:
        """End now (cancelled), wherever the lane is."""
        return self._end("cancelled")

    def release(self) -> None:
        """Let the prefix cache's background writes go on (once)."""
        if self.cache is not None:
            self.cache.request_finished()
            self.cache = None

    def _runnable(self, mode: Mode) -> Mode:
        """`mode`, or AR for spec without a drafter."""
        return "ar" if mode == "spec" and self.engine.drafter is None else mode
