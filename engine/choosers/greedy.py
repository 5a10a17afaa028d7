"""Greedy decoding: the target's (processed) argmax, in AR and speculative mode alike."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..acceptance import greedy_acceptance
from ..api import ConstraintStats
from ..host import host_int, host_ints
from .base import (
    LogitsProcessor,
    Proposal,
    Verdict,
    admissible_prefix,
    apply_processors,
    constraint_stats,
    forced_proposal,
)


class GreedyChooser:
    """Greedy decoding: the target's (processed) argmax. With no processors, verification is
    a single host sync per cycle, as in the unconstrained engine."""

    def __init__(self, processors: Sequence[LogitsProcessor] = (), guided: bool = True):
        self.processors = list(processors)
        self.guided = guided  # let a grammar processor steer the draft (see `draft`)

    def choose(self, logits: mx.array) -> int:
        if self.processors:
            logits = apply_processors(self.processors, logits[None], ())[0][0]
        return host_int(mx.argmax(logits))

    @property
    def follows_output(self) -> bool:
        return bool(self.processors)

    def choice_ahead(self, logits: mx.array, ahead: int) -> mx.array | None:
        if not self.processors:
            return mx.argmax(logits)
        if ahead:  # the processors follow the output: they wait for the token before
            return None
        # The masks of the committed output are known now, on the host; the argmax stays
        # lazy, so the forward and the choice run as one queued step.
        return mx.argmax(apply_processors(self.processors, logits[None], ())[0][0])

    def draft(self, drafter_logits: mx.array) -> Proposal:
        for p in self.processors:
            guide = getattr(p, "guide", None)
            if guide is not None and self.guided:
                # A grammar picks the drafter's best allowed token at each position.
                tokens = guide(drafter_logits)
                if tokens:
                    return Proposal(mx.array(tokens))
        return Proposal(mx.argmax(drafter_logits, axis=-1))

    def forced(self, limit: int) -> Proposal | None:
        return forced_proposal(self.processors, limit)

    def verify(self, proposal: Proposal, target_logits: mx.array) -> Verdict:
        draft = proposal.tokens
        allowed = int(draft.shape[0])
        if self.processors:
            target_logits, allowed = apply_processors(
                self.processors, target_logits, host_ints(draft)
            )
        choice = mx.argmax(target_logits, axis=-1)
        accepted_arr = greedy_acceptance(draft, choice)
        mx.eval(choice, accepted_arr)
        accepted = min(host_int(accepted_arr), allowed)
        # Read off the evaluated arrays (indexing `choice` on the device would be another sync).
        return Verdict(accepted, host_ints(draft)[:accepted] + [host_ints(choice)[accepted]])

    def admissible(self, tokens: Sequence[int]) -> int:
        return admissible_prefix(self.processors, tokens)

    def choose_run(self, proposal: Proposal, target_logits: mx.array) -> Verdict:
        # Greedy verification keeps exactly the rows where the (processed) argmax, AR's
        # choice, is the proposed token.
        return self.verify(proposal, target_logits)

    def commit(self, tokens: Sequence[int]) -> None:
        for p in self.processors:
            p.commit(tokens)

    def stats(self) -> ConstraintStats | None:
        return constraint_stats(self.processors)
