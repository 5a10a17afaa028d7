"""`SamplingChooser`: sampled decoding behind the `TokenChooser` seam, exact in both modes.

AR (and the prefill's first token) draws from the target's processed distribution p. A
speculative cycle draws each block position from the drafter's processed distribution q, then
`rejection_verify` keeps a prefix and draws one more token, so the committed tokens follow p
exactly as AR draws would. The same processors (penalties, bias, grammar masks) shape p in
both modes; the drafter's q only needs to be the distribution its tokens came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import mlx.core as mx

from ..api import ConstraintStats, SamplingParams
from ..host import host_int, host_ints
from ..sampling.rejection import rejection_verify
from ..sampling.rng import ACCEPT, CHOOSE, DRAFT, RESAMPLE, KeySchedule
from ..sampling.shaping import Shaping, sample, shape_logits, shape_probs, weights
from .base import (
    LogitsProcessor,
    Proposal,
    Verdict,
    admissible_prefix,
    apply_processors,
    constraint_stats,
    forced_proposal,
)


class ProposalAdjuster(Protocol):
    """A processor that can also shape the drafter's rows (all block positions at once)."""

    def adjust_proposal(self, logits: mx.array) -> mx.array: ...


class SamplingChooser:
    """Temperature > 0 decoding with top-k/top-p/min-p, processors and a seeded key schedule.

    `processors` rewrite the target's rows (row i sees the committed output + draft[:i]);
    `proposal_adjusters` (penalties, bias) also shape the drafter's rows so q stays close to
    p. Grammar processors are not applied to q: a drafted token they forbid has p = 0 and is
    rejected, which costs speed, never exactness."""

    def __init__(
        self,
        params: SamplingParams,
        processors: Sequence[LogitsProcessor] = (),
        proposal_adjusters: Sequence[ProposalAdjuster] = (),
    ):
        if params.greedy:
            raise ValueError("SamplingChooser needs temperature > 0 (use GreedyChooser)")
        self.shaping = Shaping.of(params)
        self.processors = list(processors)
        self.proposal_adjusters = list(proposal_adjusters)
        self.keys = KeySchedule(params.seed)
        self.position = 0  # output tokens committed so far: keys are per position

    def target_probs(self, logits: mx.array, draft: Sequence[int]) -> tuple[mx.array, int]:
        """The target's processed distribution p [n, V] and the processors' allowed prefix."""
        allowed = len(draft)
        if self.processors:
            logits, allowed = apply_processors(self.processors, logits, draft)
        return shape_probs(logits, self.shaping), allowed

    def choose(self, logits: mx.array) -> int:
        rows = logits[None]
        if self.processors:
            rows = apply_processors(self.processors, rows, ())[0]
        w = weights(shape_logits(rows, self.shaping))
        return host_int(sample(w, self.keys.key(CHOOSE, self.position))[0])

    @property
    def follows_output(self) -> bool:
        return bool(self.processors)

    def choice_ahead(self, logits: mx.array, ahead: int) -> mx.array | None:
        if self.processors:
            return None
        w = weights(shape_logits(logits[None], self.shaping))
        return sample(w, self.keys.key(CHOOSE, self.position + ahead))[0]

    def draft(self, drafter_logits: mx.array) -> Proposal:
        x = drafter_logits
        for adjuster in self.proposal_adjusters:
            x = adjuster.adjust_proposal(x)
        w = weights(shape_logits(x, self.shaping))
        tokens = sample(w, self.keys.key(DRAFT, self.position))
        return Proposal(tokens, probs=w / w.sum(axis=-1, keepdims=True))

    def forced(self, limit: int) -> Proposal | None:
        return forced_proposal(self.processors, limit)

    def verify(self, proposal: Proposal, target_logits: mx.array) -> Verdict:
        draft = proposal.tokens
        k = int(draft.shape[0])
        draft_list = host_ints(draft) if self.processors else []
        p, allowed = self.target_probs(target_logits, draft_list)
        accepted_arr, token_arr = rejection_verify(
            draft,
            proposal.probs,  # None: a deterministic (one-hot) proposal
            p,
            self.keys.key(ACCEPT, self.position),
            self.keys.key(RESAMPLE, self.position),
            allowed if self.processors and allowed < k else None,
        )
        mx.eval(accepted_arr, token_arr)
        accepted = host_int(accepted_arr)
        kept = (draft_list or host_ints(draft))[:accepted]
        return Verdict(accepted, kept + [host_int(token_arr)])

    def admissible(self, tokens: Sequence[int]) -> int:
        return admissible_prefix(self.processors, tokens)

    def choose_run(self, proposal: Proposal, target_logits: mx.array) -> Verdict:
        # Row i is drawn as the AR step at output position `position + i` would draw it
        # (same processed row, same CHOOSE key), so the result is token for token AR's.
        draft = host_ints(proposal.tokens)
        rows = target_logits
        if self.processors:
            rows = apply_processors(self.processors, rows, draft)[0]
        w = weights(shape_logits(rows, self.shaping))
        draws = mx.concatenate(
            [
                sample(w[i : i + 1], self.keys.key(CHOOSE, self.position + i))
                for i in range(int(w.shape[0]))
            ]
        )
        choice = host_ints(draws)
        accepted = 0
        while accepted < len(draft) and choice[accepted] == draft[accepted]:
            accepted += 1
        return Verdict(accepted, draft[:accepted] + [choice[accepted]])

    def commit(self, tokens: Sequence[int]) -> None:
        self.position += len(tokens)
        for p in self.processors:
            p.commit(tokens)

    def stats(self) -> ConstraintStats | None:
        return constraint_stats(self.processors)
