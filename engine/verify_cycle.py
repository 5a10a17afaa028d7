"""A session's verify cycles: a proposal (a draft, a lookup continuation or a forced run) fed
after the staged token in one target forward, judged by the chooser, and the rows of the kept
tokens committed; or, for a lookup continuation found after an AR forward was queued ahead,
fed after that forward and judged against both (`verify_after_ahead`).

The step's result types live here too: a step is what `GenerationSession.step` returns, and
the batched scheduler commits the same `StepResult` through the session's public commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx

from .api import CycleRecord, Mode
from .choosers import Proposal
from .sampling.logprobs import RawLogprob
from .targets.base import ForwardResult

if TYPE_CHECKING:
    from .session import GenerationSession

# Given the tokens a step is about to commit, the index of the last one to emit when the
# generation must end inside them (EOS, stop string, limit), else None.
StopCheck = Callable[[Sequence[int]], "int | None"]


@dataclass(frozen=True)
class QueuedStep:
    """An AR forward on the device: the staged token fed, the next token chosen lazily."""

    result: ForwardResult
    choice: mx.array | None  # None: the chooser needs the host


@dataclass(frozen=True)
class StepResult:
    """Tokens committed by one cycle or AR step, and whether generation ended in them."""

    tokens: list[int]
    record: CycleRecord
    finished: bool
    logprobs: list[RawLogprob] = field(default_factory=list)  # per token, when asked


def cut_at_stop(tokens: list[int], stop_check: StopCheck) -> tuple[list[int], int | None]:
    """`tokens` up to and including the one the generation ends at (all when it goes on), and
    that index (None when it goes on)."""
    end = stop_check(tokens)
    return (tokens[: end + 1] if end is not None else tokens), end


def verify_cycle(
    session: GenerationSession,
    mode: Mode,
    proposal: Proposal,
    block_size: int,
    stop_check: StopCheck,
    t0: float,
) -> StepResult:
    """Verify `proposal` after the staged token in one target forward and commit what the
    chooser accepts (`t0`: when the cycle's drafting began)."""
    draft = proposal.tokens
    # MLX evaluates on its own thread: the drafter computes while Python builds the verify
    # forward's graph on the still-lazy draft, and the verify runs straight after it. The
    # verdict is the cycle's one host synchronisation.
    res = session.feed_block(draft)
    drafted = int(draft.shape[0])
    t1 = time.perf_counter()

    verdict = session.chooser.verify(proposal, res.logits[0])
    t2 = time.perf_counter()

    accepted = verdict.accepted
    committed, end = cut_at_stop(verdict.tokens, stop_check)
    # Block tokens whose K/V stay.
    keep = min(accepted, len(committed) - 1) + 1
    session.target.rollback(session.cache, res, keep)
    session.keep_rows(res.logits[0], res.features, committed, keep)
    t3 = time.perf_counter()
    # Row i of the verify logits scored committed[i] (the same row an AR step would use).
    logprobs = session.logprobs_of(res.logits[0], committed)
    return session.record_step(
        mode,
        drafted + 1,
        drafted,
        accepted,
        committed,
        end,
        t1 - t0,
        t2 - t1,
        t3 - t2,
        logprobs,
        forced=drafted if proposal.forced else 0,
        # A drafter's draft shorter than the block was cut by the grammar; a lookup
        # continuation is as long as the match gives.
        draft_cut=mode == "spec" and not proposal.forced and drafted < block_size - 1,
    )


def verify_after_ahead(
    session: GenerationSession,
    ahead: QueuedStep,
    since: float | None,
    proposal: Proposal,
    stop_check: StopCheck,
    t0: float,
    mode: Mode = "lookup",
) -> StepResult:
    """A lookup cycle on top of the queued AR forward `ahead` (which fed the staged token,
    queued at `since`): feed the continuation after it and verify against both forwards'
    rows, so the forward queued while no continuation was known is not wasted when one
    appears. `mode` "ar": the continuation is a grammar-forced run that AR takes after a
    forward queued before the run was known (recorded as AR's jump-forward: nothing drafted)."""
    draft = proposal.tokens
    res = session.target.forward(
        draft[None].astype(mx.int32),
        session.cache,
        session.capture,
        keep_tape=True,
        position_shift=session.position_shift,
    )
    rows = mx.concatenate([ahead.result.logits[0, -1:], res.logits[0]], axis=0)
    verdict = session.chooser.verify(proposal, rows)
    t2 = time.perf_counter()
    committed, end = cut_at_stop(verdict.tokens, stop_check)
    # The staged token's forward stays; of the continuation, the rows of kept tokens.
    session.fed += 1
    if session.draft_ctx is not None and ahead.result.features is not None:
        session.draft_ctx.add_features(ahead.result.features)
    keep = min(verdict.accepted, len(committed) - 1)
    session.last_logits = rows[keep]
    session.target.rollback(session.cache, res, keep)
    if session.draft_ctx is not None and res.features is not None and keep > 0:
        session.draft_ctx.add_features(res.features[:, :keep])
    session.fed += keep
    session.tokens.extend(committed)
    session.chooser.commit(committed)
    t3 = time.perf_counter()
    fed = int(draft.shape[0])
    drafted, accepted = (0, 0) if mode == "ar" else (fed, verdict.accepted)
    return session.record_step(
        mode,
        fed + 1,
        drafted,
        accepted,
        committed,
        end,
        0.0,
        t2 - (since if since is not None else t0),
        t3 - t2,
        session.logprobs_of(rows, committed),
        forced=fed if proposal.forced else 0,
    )
