"""One generation's state, and the two ways to advance it: a speculative cycle or an AR step.

The session owns the target cache, the drafter context and the committed tokens. Both modes
read and write the same state, so the caller may switch at any cycle boundary; AR steps keep
queueing target features for the drafter, so speculation resumes with a coherent context.

Under an output constraint, a stretch the grammar forces (`TokenChooser.forced`) is fed in one
target forward in both modes: a spec cycle verifies it without running the drafter, and an AR
step ("jump-forward") feeds the staged token and the forced run together, keeps the tokens AR
itself would have chosen at those rows, and chooses the next free token from the last row.

Token bookkeeping: `tokens` holds every committed token (prompt + output). The last one, the
"staged" token, was chosen by the target but not yet fed to it; everything before it is in
the target cache (`fed == len(tokens) - 1`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import mlx.core as mx
from mlx.utils import tree_flatten

from toolflash.cache.state import SessionState, export_cache, restore_cache

from .api import CycleRecord, Mode
from .choosers import GreedyChooser, Proposal, TokenChooser
from .draft_context import DraftContext, DraftWindow
from .drafter import DFlashDrafter
from .host import host_int
from .lookup import LookupConfig, NgramIndex, takes_over
from .sampling.logprobs import RawLogprob, token_logprobs
from .sparse import Lineage, SparseLineageError
from .targets.base import ForwardResult, TargetAdapter
from .verify_cycle import (
    QueuedStep,
    StepResult,
    StopCheck,
    cut_at_stop,
    verify_after_ahead,
    verify_cycle,
)

__all__ = ["PREFILL_CHUNK", "GenerationSession", "StepResult", "StopCheck", "dflash_proposal"]

# The drafter's logits [1, block_size - 1, V] for block positions 1..L-1 in the current state.
Proposer = Callable[["GenerationSession", int], mx.array]
# Prompt tokens per prefill forward (EngineOptions.prefill_chunk takes this as its default).
PREFILL_CHUNK = 512


class GenerationSession:
    """Speculative and target-only decoding over one shared state."""

    def __init__(
        self,
        target: TargetAdapter,
        drafter: DFlashDrafter | None = None,
        window: DraftWindow | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        proposer: Proposer | None = None,
        chooser: TokenChooser | None = None,
        logprobs: int | None = None,
        ar_forced_limit: int = 15,
        lookup: LookupConfig = LookupConfig(),
    ):
        self.target = target
        self.drafter = drafter
        self.cache = target.make_cache()
        self.capture: tuple[int, ...] = drafter.config.target_layer_ids if drafter else ()
        self.draft_ctx = DraftContext(drafter, window or DraftWindow()) if drafter else None
        self.mask_id = drafter.config.mask_token_id if drafter else -1
        self.prefill_chunk = prefill_chunk
        self.proposer: Proposer = proposer or dflash_proposal
        self.chooser: TokenChooser = chooser or GreedyChooser()
        # None: no log-probabilities; n: each emitted token's and the n most likely.
        self.logprobs = logprobs
        self.first_logprobs: list[RawLogprob] = []
        # Longest forced run an AR step feeds in one forward (16 rows, the largest verify
        # block); 0 decodes forced tokens one step each, as AR did before jump-forward.
        self.ar_forced_limit = ar_forced_limit
        self.tokens: list[int] = []
        # Built on the first lookup step (a request that never drafts by lookup indexes nothing).
        self.lookup_config = lookup
        self._lookup: NgramIndex | None = None
        # The drafter's latest proposal, and (accepted, drafted) of its last verified one: a
        # spec cycle copies by lookup only when the drafter is not on a run (`takes_over`).
        self._drafted: Proposal | None = None
        self._drafter_last: tuple[int, int] | None = None
        self.fed = 0
        self.cycles = 0
        self.last_logits: mx.array | None = None  # target logits at the last fed position
        self._prefilled: list[int] = []
        # Prompt tokens the prefill computed (restored and dropped ones excluded).
        self.computed_prompt_tokens = 0
        # Sparse sessions keep fewer tokens in the cache than their true positions; attention
        # rotates at cache length + shift. Their state is never reusable (lineage "sparse").
        self.lineage: Lineage = "dense"
        self.position_shift = 0
        # An AR forward queued ahead of the host (`step(..., lookahead=True)`), and when the
        # step that queued it ended.
        self._ahead: QueuedStep | None = None
        self._ahead_since: float | None = None
        # The next cycle's draft, started early (`prepare`): (mode, block size, proposal).
        self._prepared: tuple[Mode, int, Proposal] | None = None

    @property
    def staged(self) -> int:
        return self.tokens[-1]

    # -- prefill -----------------------------------------------------------------------
    def prefill(
        self,
        prompt: Sequence[int],
        restore: SessionState | None = None,
        publish_at: Sequence[int] = (),
        publish: Callable[[SessionState], None] | None = None,
    ) -> int:
        """Run the prompt through the target in chunks, queue its features for the drafter,
        and commit the target's first token (returned).

        `restore` resumes from a state whose tokens are a prefix of `prompt` (only the rest
        is computed). At each position in `publish_at` the state is handed to `publish`."""
        if not prompt:
            raise ValueError("empty prompt")
        start = self.restore(prompt, restore)
        self.feed_prompt(prompt, start, len(prompt), publish_at, publish)
        return self.commit_first(prompt)

    def restore(self, prompt: Sequence[int], restore: SessionState | None) -> int:
        """Load `restore` (a state whose tokens are a prefix of `prompt`); its length."""
        if restore is None:
            return 0
        if tuple(prompt[: len(restore.tokens)]) != restore.tokens:
            raise ValueError("restored state is not a prefix of the prompt")
        self.load_state(restore)
        return len(restore.tokens)

    def feed_prompt(
        self,
        prompt: Sequence[int],
        start: int,
        end: int,
        publish_at: Sequence[int],
        publish: Callable[[SessionState], None] | None,
    ) -> None:
        """Feed prompt[start:end] in chunks, handing the state to `publish` at each position
        of `publish_at` inside (start, end] (the end of the prompt always ends a chunk)."""
        stops = sorted({p for p in publish_at if start < p <= end} | {end})
        pos = start
        for stop in stops:
            while pos < stop:
                chunk_end = min(pos + self.prefill_chunk, stop)
                self.feed_chunk(prompt[pos:chunk_end])
                pos = chunk_end
            if publish is not None and stop in publish_at:
                publish(self.export_state())

    def commit_first(self, prompt: Sequence[int]) -> int:
        """Choose and commit the first output token once all of `prompt` is fed (`feed_chunk`
        or a loaded state); it becomes the staged token."""
        assert self.last_logits is not None
        first = self.chooser.choose(self.last_logits)
        self.chooser.commit([first])
        self.first_logprobs = self.logprobs_of(self.last_logits[None], [first])
        self.tokens = [*prompt, first]
        self.fed = len(prompt)
        return first

    def feed_chunk(self, tokens: Sequence[int], position: int | None = None) -> None:
        """Feed `tokens` (at true position `position`; default: right after the cache)."""
        chunk = mx.array([list(tokens)])
        res = self.target.forward(
            chunk,
            self.cache,
            self.capture,
            last_logits_only=True,
            position_shift=self.position_shift,
        )
        self.last_logits = res.logits[0, -1]
        self._prefilled.extend(tokens)
        self.computed_prompt_tokens += len(tokens)
        if self.draft_ctx is not None and res.features is not None:
            self.draft_ctx.add_features(res.features, position)
            mx.eval(self.last_logits, res.features)
        else:
            mx.eval(self.last_logits)

    # -- state -------------------------------------------------------------------------
    def export_state(self) -> SessionState:
        """The state after every token fed so far (prefill or decode). Dense sessions only:
        a sparse-prefill state must never be reused by a dense request."""
        if self.lineage != "dense":
            raise SparseLineageError("a sparse-prefill session has no reusable state")
        self.drain()
        assert self.last_logits is not None
        fed = tuple(self._prefilled) if not self.tokens else tuple(self.tokens[: self.fed])
        draft = self.draft_ctx.export_state() if self.draft_ctx is not None else None
        return SessionState(fed, export_cache(self.cache), draft, self.last_logits)

    def settle(self) -> None:
        """Evaluate every array the session holds (caches, last logits, drafter context), so
        that another thread may go on from here: MLX streams belong to the thread that made
        them, and an array left unevaluated can be computed only on that thread."""
        held: list[object] = [c.state for c in self.cache if not c.empty()]
        if self.draft_ctx is not None:
            held.append(self.draft_ctx.arrays())
        held.append(self.last_logits)
        flat: list[tuple[str, object]] = tree_flatten(held)  # type: ignore[assignment]
        mx.eval([a for _, a in flat if isinstance(a, mx.array)])

    def load_state(self, state: SessionState) -> None:
        """Resume from `state` (the session must be fresh)."""
        if self._prefilled or self.tokens:
            raise ValueError("load_state needs a fresh session")
        restore_cache(self.cache, state.layers)
        if self.draft_ctx is not None:
            if state.draft is None:
                raise ValueError("state has no drafter context but the session has a drafter")
            self.draft_ctx.load_state(state.draft)
        self.last_logits = state.last_logits
        self._prefilled = list(state.tokens)

    # -- decode ------------------------------------------------------------------------
    def step(
        self, mode: Mode, block_size: int, stop_check: StopCheck, lookahead: bool = False
    ) -> StepResult:
        """Advance by one speculative cycle (`spec`: the drafter's block; `lookup`: the
        continuation of the suffix's latest earlier occurrence, an AR step where there is
        none) or one target-only step (`ar`).

        `lookahead` (AR, and lookup steps that find no match): queue the next AR step's
        forward on the device before this step's token is read, as mlx-lm's `generate_step`
        does, so the next step's compute overlaps the caller's work between steps. If the next
        call is not an AR step, or this token ends the generation, the queued forward is undone
        first (`drain`): no token is lost and the cache holds exactly what plain AR would. A
        lookup step that finds a match after a queued forward keeps it: the queued forward is
        the verify's first row (`verify_after_ahead`)."""
        if mode == "spec" and self.draft_ctx is not None and block_size > 1:
            self.drain()
            return self._spec_cycle(block_size, stop_check)
        if mode == "lookup" and block_size > 1:
            return self._lookup_step(block_size, stop_check, lookahead)
        self._prepared = None
        return self._ar_step(stop_check, lookahead, "lookup" if mode == "lookup" else "ar")

    def _lookup_step(self, block_size: int, stop_check: StopCheck, lookahead: bool) -> StepResult:
        """Verify the lookup continuation if the suffix matches, else an AR step (counted as
        lookup's, queueing the next forward ahead with `lookahead`)."""
        t0 = time.perf_counter()
        proposal = self._take_prepared("lookup", block_size) or self._lookup_proposal(block_size)
        if proposal is None:
            return self._ar_step(stop_check, lookahead, "lookup")
        if self._ahead is not None:  # its choice deferred or not: the verify chooses again
            ahead, since = self._ahead, self._ahead_since
            self._ahead = self._ahead_since = None
            return verify_after_ahead(self, ahead, since, proposal, stop_check, t0)
        self.drain()
        return verify_cycle(self, "lookup", proposal, block_size, stop_check, t0)

    def prepare(self, mode: Mode, block_size: int) -> None:
        """Start the next step's device work now, so it computes while the caller finishes its
        work for this one (detokenizing, handing the event on): a spec cycle's draft, or an AR
        step's forward (after an AR step with `lookahead` that is queued already). A spec step
        at `block_size` takes the draft, any other step drops it (drafting has no effect on the
        target cache; the features it absorbed belong to the drafter context either way); an
        AR step takes the forward, any other step undoes it (`drain`)."""
        if self._ahead is not None:
            return
        if mode == "spec" and self.draft_ctx is not None and block_size > 1:
            self._prepared = ("spec", block_size, self.propose(block_size))
            return
        if mode == "lookup" and block_size > 1:
            proposal = self._lookup_proposal(block_size)
            if proposal is not None:
                self._prepared = ("lookup", block_size, proposal)
                return
        # A chooser that follows the output would mask this forward's row before a forced
        # run is known (`_ar_step` takes forced runs first): no forward ahead of it here.
        if mode != "spec" and not self.chooser.follows_output:
            self._ahead = self._queue_ar(mx.array(self.staged), 0)
            self._ahead_since = time.perf_counter()

    def _take_prepared(self, mode: Mode, block_size: int) -> Proposal | None:
        """The draft `prepare` started for a `mode` cycle at `block_size` (else None; any
        other prepared draft is dropped)."""
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[:2] == (mode, block_size):
            return prepared[2]
        return None

    def _lookup_proposal(self, block_size: int) -> Proposal | None:
        """Tokens a constraint forces, else the continuation of the suffix's latest earlier
        occurrence (`NgramIndex`), else None."""
        proposal = self.chooser.forced(block_size - 1)
        if proposal is not None:
            return proposal
        tokens = self._copied(block_size - 1)
        return Proposal(mx.array(tokens, dtype=mx.int32)) if tokens else None

    def _copied(self, limit: int) -> list[int]:
        """Up to `limit` tokens of the lookup continuation ([] without a match), cut before
        the first token the output constraint rejects (verifying it could only fail there)."""
        if self._lookup is None:
            self._lookup = NgramIndex(self.lookup_config)
        copied = self._lookup.propose(self.tokens, limit)
        return copied[: self.chooser.admissible(copied)] if copied else copied

    def propose(self, block_size: int) -> Proposal:
        """The cycle's proposal, its evaluation started: `copied_proposal`'s where there is
        one, else the drafter's block."""
        proposal = self.copied_proposal(block_size) or self.draft(block_size)
        mx.async_eval(proposal.tokens)
        return proposal

    def copied_proposal(self, block_size: int) -> Proposal | None:
        """A proposal with no drafter run: tokens a constraint forces, else (with
        `LookupConfig.spec_takeover`) a lookup continuation that fills the whole block while
        the drafter is not on a run (`takes_over`); None when the drafter must draft."""
        proposal = self.chooser.forced(block_size - 1)
        if proposal is None and self.lookup_config.spec_takeover:
            copied = self._copied(block_size - 1)
            if takes_over(len(copied), block_size - 1, self._drafter_last):
                proposal = Proposal(mx.array(copied, dtype=mx.int32))
        return proposal

    def draft(self, block_size: int, logits: mx.array | None = None) -> Proposal:
        """The drafter's block: from `logits` [block_size - 1, V] where the caller ran the
        drafter already (several sessions in one forward), else from this session's
        proposer."""
        if logits is None:
            logits = self.proposer(self, block_size)[0]
        self._drafted = self.chooser.draft(logits)
        return self._drafted

    def drain(self) -> None:
        """Undo a queued AR forward (the cache then ends right before the staged token)."""
        ahead = self._ahead
        if ahead is not None:
            self._ahead = None
            self._ahead_since = None
            self.target.rollback(self.cache, ahead.result, 0)

    def _queue_ar(self, token: mx.array, ahead: int) -> QueuedStep:
        """Feed `token` (the staged one, maybe still on the device) to the target and choose
        the next token on the device, starting its evaluation at once. The choice is None
        when the chooser needs the host (then nothing was evaluated yet)."""
        res = self.target.forward(
            token.reshape(1, 1), self.cache, self.capture, position_shift=self.position_shift
        )
        choice = self.chooser.choice_ahead(res.logits[0, -1], ahead)
        if choice is not None:
            # Only the choice: the captured layer outputs are computed on its way and kept
            # (their concatenation for the drafter waits until speculation absorbs them).
            mx.async_eval(choice)
        elif ahead:
            # Its choice waits for the token before it (processors that follow the output,
            # `_ar_step`); the forward runs meanwhile.
            mx.async_eval(res.logits)
        return QueuedStep(res, choice)

    def _ar_step(
        self, stop_check: StopCheck, lookahead: bool = False, mode: Mode = "ar"
    ) -> StepResult:
        t0 = time.perf_counter()
        # Only processors that follow the output force runs: nothing to ask otherwise.
        if self.ar_forced_limit > 0 and self.chooser.follows_output:
            proposal = self.chooser.forced(self.ar_forced_limit)
            if proposal is not None:
                ahead, since = self._ahead, self._ahead_since
                if ahead is not None:
                    # Queued before the run was known (its choice deferred): it fed the staged
                    # token, the run goes after it (both forwards' rows choose as one jump).
                    self._ahead = self._ahead_since = None
                    return verify_after_ahead(self, ahead, since, proposal, stop_check, t0, "ar")
                self.drain()
                return self._ar_forced_run(proposal, stop_check, t0)
        current = self._ahead
        if current is None:
            current = self._queue_ar(mx.array(self.staged), 0)
            if current.choice is None:
                return self._ar_step_on_host(current.result, stop_check, t0, mode)
        elif current.choice is None:
            # Queued before the last token was read, by a chooser whose processors follow the
            # output: its masks are known now, while the forward computes.
            choice = self.chooser.choice_ahead(current.result.logits[0, -1], 0)
            if choice is None:
                self._ahead = self._ahead_since = None
                return self._ar_step_on_host(current.result, stop_check, t0, mode)
            mx.async_eval(choice)
            current = QueuedStep(current.result, choice)
        choice = current.choice
        assert choice is not None
        # The next step's forward goes in before this token is read: its input is the
        # still-lazy choice, so the device runs straight on while the host reads.
        self._ahead = self._queue_ar(choice, 1) if lookahead else None
        token = host_int(choice)
        res = current.result
        self.last_logits = res.logits[0, -1]
        if self.draft_ctx is not None and res.features is not None:
            self.draft_ctx.add_features(res.features)
        t1 = time.perf_counter()
        # A pipelined step's cost is the interval since the previous one ended (its forward
        # started then); an unpipelined step's is its own duration.
        verify_s = t1 - (self._ahead_since if self._ahead_since is not None else t0)
        self._ahead_since = t1 if self._ahead is not None else None
        end = self._commit_ar(token, stop_check)
        if end is not None:
            self.drain()
        logprobs = self.logprobs_of(self.last_logits[None], [token])
        return self.record_step(mode, 1, 0, 0, [token], end, 0.0, verify_s, 0.0, logprobs)

    def _ar_step_on_host(
        self, res: ForwardResult, stop_check: StopCheck, t0: float, mode: Mode = "ar"
    ) -> StepResult:
        """An AR step whose choice needs the host (processors that follow the output)."""
        self.last_logits = res.logits[0, -1]
        if self.draft_ctx is not None and res.features is not None:
            self.draft_ctx.add_features(res.features)
            mx.eval(self.last_logits, res.features)
        token = self.chooser.choose(self.last_logits)
        t1 = time.perf_counter()
        end = self._commit_ar(token, stop_check)
        logprobs = self.logprobs_of(self.last_logits[None], [token])
        return self.record_step(mode, 1, 0, 0, [token], end, 0.0, t1 - t0, 0.0, logprobs)

    def _commit_ar(self, token: int, stop_check: StopCheck) -> int | None:
        """Commit one AR token (the staged one is now fed); the stop check's verdict."""
        self.fed += 1
        end = stop_check([token])
        self.tokens.append(token)
        self.chooser.commit([token])
        return end

    def _ar_forced_run(self, proposal: Proposal, stop_check: StopCheck, t0: float) -> StepResult:
        """AR over a grammar-forced run of k tokens in one forward: feed the staged token and
        the run (k + 1 rows, like a verify block with no drafter), keep what AR would choose
        at each row (`choose_run`), so the output is that of k + 1 one-token steps. A stop
        inside the run keeps nothing after it (K/V, recurrent state, drafter features)."""
        run = proposal.tokens
        k = int(run.shape[0])
        res = self.feed_block(run)
        verdict = self.chooser.choose_run(proposal, res.logits[0])
        t1 = time.perf_counter()
        committed, end = cut_at_stop(verdict.tokens, stop_check)
        # Rows fed: the staged token + every committed token but the last.
        self.target.rollback(self.cache, res, len(committed))
        self.keep_rows(res.logits[0], res.features, committed, len(committed))
        t2 = time.perf_counter()
        logprobs = self.logprobs_of(res.logits[0], committed)
        # No drafter ran and nothing was drafted: `forced` says how long the fed run was.
        return self.record_step(
            "ar", k + 1, 0, 0, committed, end, 0.0, t1 - t0, t2 - t1, logprobs, forced=k
        )

    def _spec_cycle(self, block_size: int, stop_check: StopCheck) -> StepResult:
        t0 = time.perf_counter()
        proposal = self._take_prepared("spec", block_size) or self.propose(block_size)
        step = verify_cycle(self, "spec", proposal, block_size, stop_check, t0)
        if proposal is self._drafted:
            self._drafter_last = (step.record.accepted, step.record.drafted)
        return step

    def feed_block(self, tail: mx.array) -> ForwardResult:
        """One target forward of the staged token followed by `tail` (a draft or a forced
        run), keeping what `rollback` needs."""
        tokens = mx.concatenate([mx.array([[self.staged]]), tail[None].astype(mx.int32)], axis=1)
        return self.target.forward(
            tokens, self.cache, self.capture, keep_tape=True, position_shift=self.position_shift
        )

    def keep_rows(
        self, logits: mx.array, features: mx.array | None, committed: list[int], keep: int
    ) -> None:
        """After a block forward whose target state was rolled back to its first `keep` rows:
        keep those rows' drafter features (`features` [1, T, F]) and the logits of the last
        (`logits` [T, V]), and commit `committed`; its last token becomes the staged one."""
        self.last_logits = logits[keep - 1]
        if self.draft_ctx is not None and features is not None:
            self.draft_ctx.add_features(features[:, :keep])
        self.fed += keep
        self.tokens.extend(committed)
        self.chooser.commit(committed)

    # -- rows of a batched forward (the scheduler ran it; the caches were a batch row) --
    def leave_solo(self) -> None:
        """Undo what a step alone queued ahead before the cache joins a batch: an AR forward
        (`drain`) and a draft started early (made for a state the batch moves on from)."""
        self.drain()
        self._prepared = None

    def commit_batched_token(
        self,
        token: int,
        logits: mx.array,
        features: mx.array | None,
        stop_check: StopCheck,
        step_s: float,
        rows: int,
    ) -> StepResult:
        """Commit the token a batched AR forward chose from this row's `logits` [V] (the
        staged token was fed there; `features` [1, 1, F]): what an AR step commits."""
        self.last_logits = logits
        if self.draft_ctx is not None and features is not None:
            self.draft_ctx.add_features(features)
        end = self._commit_ar(token, stop_check)
        logprobs = self.logprobs_of(logits[None], [token])
        return self.record_step("ar", 1, 0, 0, [token], end, 0.0, step_s, 0.0, logprobs, rows=rows)

    def commit_batched_block(
        self,
        proposal: Proposal,
        judged: tuple[list[int], int, int | None],
        logits: mx.array,
        features: mx.array | None,
        times: tuple[float, float, float],
        block_size: int,
        rows: int,
    ) -> StepResult:
        """Commit a proposal a batched verify judged (`judged`: the tokens cut at a stop, the
        accepted count, the stop's index) from this row's verify `logits` [d+1, V] and
        `features` [1, T, F], its target state already rolled back to the kept rows: what a
        spec cycle commits."""
        committed, accepted, end = judged
        self.keep_rows(logits, features, committed, min(accepted, len(committed) - 1) + 1)
        logprobs = self.logprobs_of(logits, committed)
        drafted = int(proposal.tokens.shape[0])
        step = self.record_step(
            "spec",
            drafted + 1,
            drafted,
            accepted,
            committed,
            end,
            *times,
            logprobs,
            forced=drafted if proposal.forced else 0,
            draft_cut=not proposal.forced and drafted < block_size - 1,
            rows=rows,
        )
        if proposal is self._drafted:
            self._drafter_last = (accepted, drafted)
        return step

    def logprobs_of(self, logits: mx.array, tokens: list[int]) -> list[RawLogprob]:
        if self.logprobs is None:
            return []
        return token_logprobs(logits, tokens, self.logprobs)

    def record_step(
        self,
        mode: Mode,
        block_size: int,
        drafted: int,
        accepted: int,
        committed: list[int],
        end: int | None,
        draft_s: float,
        verify_s: float,
        rollback_s: float,
        logprobs: list[RawLogprob],
        forced: int = 0,
        draft_cut: bool = False,
        rows: int = 1,
    ) -> StepResult:
        """The step's record (its index, the context length now) and result; counts it."""
        record = CycleRecord(
            index=self.cycles,
            mode=mode,
            block_size=block_size,
            drafted=drafted,
            accepted=accepted,
            committed=len(committed),
            draft_s=draft_s,
            verify_s=verify_s,
            rollback_s=rollback_s,
            context_len=self.fed,
            forced=forced,
            draft_cut=draft_cut,
            rows=rows,
        )
        self.cycles += 1
        return StepResult(committed, record, end is not None, logprobs)


def dflash_proposal(session: GenerationSession, block_size: int) -> mx.array:
    """The DFlash draft: denoise [staged, mask * (L-1)] against the drafter context; the
    target's lm_head scores block positions 1..L-1 (the chooser turns them into tokens)."""
    assert session.drafter is not None and session.draft_ctx is not None
    ctx_kv = session.draft_ctx.absorb()
    block = mx.array([[session.staged] + [session.mask_id] * (block_size - 1)])
    drafter = session.drafter
    positions = session.draft_ctx.positions_array() if drafter.has_sliding_layers else None
    hidden = drafter.denoise(session.target.embed(block), session.fed, ctx_kv, None, positions)
    return session.target.lm_head(hidden[:, 1:])
