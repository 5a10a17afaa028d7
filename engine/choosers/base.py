"""The token-chooser seam: `TokenChooser` (target logits to committed tokens, drafter logits
to a `Proposal`, a block judged into a `Verdict`), the `LogitsProcessor` contract, and the
helpers every chooser applies processors with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from ..api import ConstraintStats


class LogitsProcessor(Protocol):
    """Rewrites target logits before selection. Stateful: it follows the committed output."""

    def process(self, logits: mx.array, draft: Sequence[int]) -> tuple[mx.array, int]:
        """`logits` [n, V]: row i scores the token after the committed tokens + `draft[:i]`
        (n <= len(draft) + 1). Returns the processed rows and how many leading `draft`
        tokens this processor allows (len(draft) when it has no objection); rows after the
        first disallowed token are never used."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """The output tokens the session committed, in order (called once per step)."""
        ...

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens that must come next whatever the model says ([] if none)."""
        ...

    def stats(self) -> ConstraintStats | None:
        """What this processor did as an output constraint so far (None: not a constraint)."""
        ...


@dataclass(frozen=True)
class Proposal:
    """Drafted tokens for block positions 1..L-1 and the distribution they were drawn from.

    `probs` [L-1, V] is the drafter's (processed) distribution q at each position; None when
    the tokens are deterministic (greedy argmax, or forced by a constraint)."""

    tokens: mx.array  # [L-1] int
    probs: mx.array | None = None
    forced: bool = False


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying a block: `accepted` drafted tokens kept, then `tokens` = those
    plus the one token the target chose after them."""

    accepted: int
    tokens: list[int]


class TokenChooser(Protocol):
    """Selects committed tokens from target logits, the same way in both modes."""

    def choose(self, logits: mx.array) -> int:
        """The next token from target logits [V] at the staged position (AR, and prefill)."""
        ...

    @property
    def follows_output(self) -> bool:
        """Whether choosing needs the committed output on the host (processors that follow
        it: a grammar's masks, penalties): then a token `ahead` of the committed ones is
        chosen only once the tokens before it are read."""
        ...

    def choice_ahead(self, logits: mx.array, ahead: int) -> mx.array | None:
        """`choose` left on the device: the token from target logits [V] for the output
        position `ahead` tokens after the committed ones, as a lazy int array, so an AR step
        can queue the next forward before the host reads this token. None when choosing
        needs the host (`follows_output`, for a position past the committed output)."""
        ...

    def draft(self, drafter_logits: mx.array) -> Proposal:
        """A proposal from the drafter's logits [L-1, V] for block positions 1..L-1."""
        ...

    def forced(self, limit: int) -> Proposal | None:
        """A proposal of tokens the output constraint forces (no drafter run), or None."""
        ...

    def verify(self, proposal: Proposal, target_logits: mx.array) -> Verdict:
        """Accept a prefix of `proposal` against the target's logits [L, V] (row i scores the
        token after the staged token + the first i drafted tokens) and choose one more."""
        ...

    def admissible(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the output constraint allows next (all without one)."""
        ...

    def choose_run(self, proposal: Proposal, target_logits: mx.array) -> Verdict:
        """AR's own choice at every row of `target_logits` [k+1, V] (row i after the staged
        token + the first i tokens of a forced `proposal` of k), fed in one forward: the
        proposal's tokens up to the first where AR would choose otherwise, then AR's choice
        there. Exactly what k+1 one-token AR steps would commit (same draws when sampled)."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens the session finally kept from the last choose/verify (a stop may have
        cut them short)."""
        ...

    def stats(self) -> ConstraintStats | None:
        """The output constraint's figures so far (None: the request has no constraint)."""
        ...


def apply_processors(
    processors: Sequence[LogitsProcessor], logits: mx.array, draft: Sequence[int]
) -> tuple[mx.array, int]:
    """Run every processor over `logits` rows; the allowed draft prefix is the shortest any
    of them reports."""
    allowed = len(draft)
    for p in processors:
        logits, ok = p.process(logits, draft)
        allowed = min(allowed, ok)
    return logits, allowed


def forced_proposal(processors: Sequence[LogitsProcessor], limit: int) -> Proposal | None:
    """A one-hot proposal of the first non-empty forced run any processor reports, or None."""
    for p in processors:
        run = p.forced(limit)
        if run:
            return Proposal(mx.array(run[:limit]), forced=True)
    return None


def admissible_prefix(processors: Sequence[LogitsProcessor], tokens: Sequence[int]) -> int:
    """The shortest allowed prefix of `tokens` any processor that checks drafts (a grammar:
    `admissible`) reports; penalties and bias allow every token."""
    allowed = len(tokens)
    for p in processors:
        check = getattr(p, "admissible", None)
        if check is not None and allowed > 0:
            allowed = min(allowed, int(check(tokens[:allowed])))
    return allowed


def constraint_stats(processors: Sequence[LogitsProcessor]) -> ConstraintStats | None:
    """The constraint figures of all `processors` together (None when none is a constraint)."""
    total: ConstraintStats | None = None
    for p in processors:
        s = p.stats()
        if s is not None:
            total = s if total is None else total + s
    return total
