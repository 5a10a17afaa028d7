"""One request's generation, step by step: the engine's one request loop.

A lane holds what a request needs between steps: its session, the prefix cache's hit and the
states to publish (`PrefixCache`), the mode and block of each step (`ModeControl`), the stop
matcher and the text (`TextTracker`), the cycle records and the stats. It prefills one chunk per
`prefill_step`, then decodes one step per `solo_step` (the session's own cycle or AR step, under
the request's mode control) or per commit of a row of a batched forward (`commit_row`,
`commit_block`: the scheduler ran the forward). Every way commits through the same matcher, text
tracker, prefix cache and stats, so a request's events do not depend on which ran it.

`DFlashEngine.generate` is a lane run alone (`prefill_step` until prefilled, then `solo_step`
until done); `batching.EngineBatcher` interleaves lanes. The steps are generators: code after an
event runs once the consumer asks for the next one (publishing the prefix cache's states after
the first token, the controller's bookkeeping after the `FinishEvent`); the scheduler takes a
step's events as a list, which runs all of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import structlog

from toolflash.cache.state import SessionState

from .api import (
    ContextLengthError,
    CycleRecord,
    EngineEvent,
    FinishEvent,
    GenerationRequest,
    GenerationStats,
    Mode,
    ModeController,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
)
from .choosers import Proposal, build_chooser
from .mode_control import ModeControl
from .sampling.logprobs import RawLogprob
from .session import GenerationSession, StepResult
from .sparse_prefill import sparse_feed
from .stops import StopMatcher
from .text import TextTracker
from .verify_cycle import cut_at_stop

if TYPE_CHECKING:
    from .service import DFlashEngine

log = structlog.get_logger(__name__)

# Release MLX's buffer cache this often (tokens) so long generations do not hold peak memory.
CLEAR_CACHE_EVERY = 1024

# A batched verify's judgement of one row: the tokens to commit (cut at a stop), how many
# drafted tokens were accepted, the stop's index (None: the generation goes on).
Judged = tuple[list[int], int, "int | None"]


class Lane:
    """A request's generation, advanced one step at a time."""

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
        self.control = ModeControl(
            request,
            controller,
            spec_block=request.block_size or engine.default_block_size,
            lookup_block=request.block_size or engine.options.lookup.block_size,
            drafter=engine.drafter is not None,
            draft_length=request.draft_length or engine.options.draft_length,
        )
        self.session = GenerationSession(
            engine.target,
            engine.drafter,
            window=engine.options.window,
            prefill_chunk=engine.options.prefill_chunk,
            chooser=build_chooser(request, engine.target.vocab_size, engine.tokenizer),
            logprobs=request.logprobs,
            lookup=engine.options.lookup,
        )
        self.matcher = StopMatcher(
            (frozenset() if request.ignore_eos else engine.eos_ids) | request.stop_token_ids,
            request.stop_strings,
            min(request.max_tokens, engine.context_length - len(prompt)),
            engine.decode,
        )
        self.text = TextTracker(engine.decode, request.stop_strings, self.matcher.eos_ids)
        self.cycles: list[CycleRecord] = []
        # Background snapshot writes wait while a request runs (`release` lets them go on).
        self.cache = engine.prefix_cache
        if self.cache is not None:
            self.cache.request_started()
        # Prefill: the controller's reads start beside it, the longest cached prefix is
        # restored, the rest computed chunk by chunk.
        self.t0 = time.perf_counter()
        self.control.prepare(len(prompt), engine.submit)
        hit = self.cache.lookup(engine.cache_key, prompt) if self.cache is not None else None
        self.restored = len(hit.snapshot.tokens) if hit is not None else 0
        # Opt-in sparse prefill: its chunks are fed in one step, and the session never
        # becomes a batch row (rows rotate at their cache length, a sparse session at its
        # true positions).
        self.selection = engine.sparse_selection(request, prompt, self.restored)
        if hit is not None:
            self.session.load_state(hit.snapshot.state)
        self._pos = self.restored
        self._publish_at = sorted(
            {p for p in request.publish_at if self.restored < p <= len(prompt)}
            if self.cache is not None
            else set()
        )
        # States reached at `publish_at`, published once the first token is out (publishing
        # evaluates and queues them, which must not delay TTFT; MLX arrays are values, so a
        # state exported mid-prefill is unchanged by what follows).
        self._deferred: list[SessionState] = []
        self.prefill_s = 0.0
        self.t_decode = 0.0
        self.decode_s = 0.0
        self.done = False
        self.prefilled = False
        # Set by the scheduler while the caches are a batch row: returns them as this
        # session's own (called before the end publishes the state).
        self.reclaim: Callable[[], list[Any]] | None = None
        self._block = 0  # the block of the batched step under way (`batch_mode`)

    # -- prefill ---------------------------------------------------------------------------
    @property
    def fed(self) -> bool:
        """Whether all of the prompt is in the session (fed, or restored from the cache)."""
        return self._pos >= len(self.prompt)

    def feed_next(self, settle: bool = False) -> None:
        """Feed the next prompt chunk (a sparse prefill: all of its chunks). With `settle`,
        every array this leaves (the session's, the states to publish) is evaluated, so that
        the lane may go on on another thread (`EngineBatcher`'s prefill thread)."""
        session = self.session
        if self.selection is not None:
            publish_at, self._publish_at = self._publish_at, []
            sparse_feed(
                session,
                self.prompt,
                self.selection,
                self.restored,
                publish_at,
                self._deferred.append,
            )
            self._pos = len(self.prompt)
        else:
            stop = self._publish_at[0] if self._publish_at else len(self.prompt)
            end = min(self._pos + session.prefill_chunk, stop)
            session.feed_chunk(self.prompt[self._pos : end])
            self._pos = end
            if self._publish_at and end == self._publish_at[0]:
                self._publish_at.pop(0)
                self._deferred.append(session.export_state())
        if settle:
            session.settle()
            mx.eval([a for state in self._deferred for a in state.arrays()])

    def prefill_step(self, prepare: bool = True) -> Iterator[EngineEvent]:
        """Feed the next prompt chunk (unless `feed_next` fed the last one already); once the
        prompt is all in, commit the first token and yield its event (and the end, when that
        token ends the generation). With `prepare` (the lane decodes alone next), the first
        step's device work starts before the event."""
        if not self.fed:
            self.feed_next()
            if not self.fed:
                return
        yield from self._first(prepare)

    def _first(self, prepare: bool) -> Iterator[EngineEvent]:
        session, engine = self.session, self.engine
        first = session.commit_first(self.prompt)
        self.prefilled = True
        if self.cache is not None:
            self.cache.record_prefill(self.restored, session.computed_prompt_tokens)
        self.prefill_s = time.perf_counter() - self.t0
        self.t_decode = time.perf_counter()
        finished = self.matcher.check([first]) is not None
        first_text = self.text.push([first])
        # The controller's first decision: the first token's text may open a span already.
        self.control.start(len(self.prompt), first_text or engine.decode([first]))
        ends = finished or self.text.stopped
        if prepare and not ends:
            self.control.prepare_next(session, self.matcher.remaining)
        try:
            yield TokenEvent((first,), first_text, None, self._logprobs(session.first_logprobs))
        finally:  # also when the consumer stops right after the first token
            deferred, self._deferred = self._deferred, []
            for state in deferred:
                self._publish(state)
        if ends:
            yield from self._end(None)

    # -- decode ----------------------------------------------------------------------------
    @property
    def solo_only(self) -> bool:
        """Whether this lane must decode alone (a sparse session is never a batch row)."""
        return self.selection is not None

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def solo_step(self, prepare: bool = True) -> Iterator[EngineEvent]:
        """One cycle or AR step alone, under the request's mode control; with `prepare`, the
        next step's device work starts before the event goes out (only where the next step
        is expected to run alone too)."""
        if self.cancelled:
            yield from self._end("cancelled")
            return
        remaining = self.matcher.remaining
        mode, block = self.control.next_step(remaining)
        # An AR step (or a lookup step that finds no match) queues the next one's forward
        # unless this must be the last.
        lookahead = prepare and mode != "spec" and remaining > 1
        step = self.session.step(mode, block, self.matcher.check, lookahead)
        yield from self._after(step, judged=True, prepare=prepare)

    # -- rows of a batched step (the scheduler runs the forward) -----------------------------
    def batch_mode(self) -> Mode:
        """Plan this lane's next step as a row of a batched one: "spec" where its mode is spec
        with a block to draft, else "ar" (lookup, AR, or a last token)."""
        mode, self._block = self.control.next_step(self.matcher.remaining)
        spec = mode == "spec" and self._block > 1 and self.session.draft_ctx is not None
        return "spec" if spec else "ar"

    def leave_solo(self) -> None:
        """Before the session's cache joins a batch: undo what a solo step queued ahead."""
        self.session.leave_solo()

    def choice(self, logits: mx.array) -> mx.array | int:
        """The next token from this row's logits [V]: left on the device where the chooser
        can (greedy, sampled), else chosen on the host (processors that follow the output)."""
        lazy = self.session.chooser.choice_ahead(logits, 0)
        return lazy if lazy is not None else self.session.chooser.choose(logits)

    def choice_after_next(self, logits: mx.array) -> mx.array | None:
        """The token after the one this step commits, from this row's logits [V] of a forward
        queued ahead (on the device; None where the chooser needs the host)."""
        return self.session.chooser.choice_ahead(logits, 1)

    def commit_row(
        self, token: int, logits: mx.array, features: mx.array | None, step_s: float, rows: int
    ) -> list[EngineEvent]:
        """Commit the token a batched AR step chose for this row (the staged token was fed
        there), as the session's AR step commits it."""
        step = self.session.commit_batched_token(
            token, logits, features, self.matcher.check, step_s, rows
        )
        return list(self._after(step, judged=False, prepare=False))

    @property
    def block(self) -> int:
        """The block `batch_mode` planned for this row's next batched step."""
        return self._block

    def copied_proposal(self) -> Proposal | None:
        """This row's proposal for a batched verify where no drafter runs for it (forced
        tokens, a lookup takeover); None when it drafts (`draft`)."""
        return self.session.copied_proposal(self._block)

    def draft(self, logits: mx.array | None = None) -> Proposal:
        """This row's drafted proposal: from `logits` [block - 1, V] of a drafter forward run
        for several rows, else from its own drafter forward."""
        return self.session.draft(self._block, logits)

    def judge(self, proposal: Proposal, logits: mx.array) -> Judged:
        """Verify `proposal` against this row's verify logits [d+1, V]."""
        verdict = self.session.chooser.verify(proposal, logits)
        committed, end = cut_at_stop(verdict.tokens, self.matcher.check)
        return committed, verdict.accepted, end

    def commit_block(
        self,
        proposal: Proposal,
        judged: Judged,
        logits: mx.array,
        features: mx.array | None,
        times: tuple[float, float, float],
        rows: int,
    ) -> list[EngineEvent]:
        """Commit a judged block (its K/V and recurrent state already rolled back to the kept
        rows by the scheduler), as the session's spec cycle commits it."""
        step = self.session.commit_batched_block(
            proposal, judged, logits, features, times, self._block, rows
        )
        return list(self._after(step, judged=False, prepare=False))

    # -- every step ------------------------------------------------------------------------
    def _after(self, step: StepResult, judged: bool, prepare: bool) -> Iterator[EngineEvent]:
        self.cycles.append(step.record)
        delta = self.text.push(step.tokens)
        self.control.after_step(step.record, step.tokens, delta, judged)
        ends = step.finished or self.text.stopped
        if prepare and not ends:
            self.control.prepare_next(self.session, self.matcher.remaining)
        yield TokenEvent(tuple(step.tokens), delta, step.record, self._logprobs(step.logprobs))
        if len(self.session.tokens) % CLEAR_CACHE_EVERY < len(step.tokens):
            mx.clear_cache()
        if ends:
            yield from self._end(None)

    def _end(self, reason: str | None) -> Iterator[EngineEvent]:
        """The text held back, the final state published, the stats and the `FinishEvent`
        (the session's cache must be its own again: a batch row is reclaimed first)."""
        if self.done:
            return
        self.done = True
        if self.reclaim is not None:
            self.session.cache, self.reclaim = self.reclaim(), None
        self.session.drain()
        self.decode_s = time.perf_counter() - self.t_decode if self.prefilled else 0.0
        if reason is None:
            reason = "stop" if self.text.stopped else (self.matcher.reason or "length")
        tail = self.text.flush()
        if tail:
            yield TokenEvent((), tail)
        session = self.session
        # A sparse session's state is never reusable (its dense head was published above).
        sparse = session.lineage == "sparse"
        if self.prefilled and session.fed > 0 and not sparse:
            self._publish(session.export_state())
        stats = GenerationStats(
            prompt_tokens=len(self.prompt),
            cached_tokens=self.restored,
            completion_tokens=len(self.matcher.emitted),
            prefill_s=self.prefill_s,
            decode_s=self.decode_s,
            cycles=tuple(self.cycles),
            constraint=session.chooser.stats(),
            computed_tokens=session.computed_prompt_tokens,
            sparse=sparse,
        )
        log.debug(
            "generation",
            request_id=self.request.request_id,
            finish=reason,
            tokens=stats.completion_tokens,
            tau=round(stats.tokens_per_cycle, 2),
        )
        try:
            yield FinishEvent(reason, stats)  # type: ignore[arg-type]
        finally:
            # After the event: the controller's bookkeeping (estimates, counters, log lines)
            # runs while the response goes out, not before it; also when the consumer stops
            # at the FinishEvent.
            try:
                if self.prefilled:
                    self.control.finish(stats)
            finally:
                self.release()

    def abort(self) -> list[EngineEvent]:
        """End now (cancelled), wherever the lane is."""
        return list(self._end("cancelled"))

    def release(self) -> None:
        """Let the prefix cache's background writes go on (once)."""
        if self.cache is not None:
            self.cache.request_finished()
            self.cache = None

    def _publish(self, state: SessionState) -> None:
        if self.engine.prefix_cache is not None:
            self.engine.prefix_cache.publish(self.engine.cache_key, state)

    def _logprobs(self, raw: Sequence[RawLogprob]) -> tuple[TokenLogprob, ...]:
        """With token texts; EOS tokens never become text, so they get no entry either."""
        decode, eos = self.engine.decode, self.engine.eos_ids
        return tuple(
            TokenLogprob(
                r.token_id,
                decode([r.token_id]),
                r.logprob,
                tuple(TopLogprob(t, decode([t]), lp) for t, lp in r.top),
            )
            for r in raw
            if r.token_id not in eos
        )
