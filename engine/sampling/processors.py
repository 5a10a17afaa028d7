"""Logits processors for OpenAI's `frequency_penalty`, `presence_penalty` and `logit_bias`.

They follow the `LogitsProcessor` contract of `engine.choosers`: row i of a verify block sees
the counts of the committed output plus `draft[:i]`, so a speculative cycle penalises exactly
what an AR step at that position would. Both modes (and the greedy rule) use them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import mlx.core as mx

from ..api import ConstraintStats, SamplingParams


class PenaltyProcessor:
    """logit -= frequency_penalty * count + presence_penalty * (count > 0), where count is how
    often the token occurs in the output so far (the prompt does not count, as in OpenAI's and
    vLLM's definition)."""

    def __init__(self, vocab_size: int, frequency: float, presence: float):
        self.vocab_size = vocab_size
        self.frequency = frequency
        self.presence = presence
        self.counts = mx.zeros((vocab_size,), dtype=mx.float32)

    def _penalty(self, counts: mx.array) -> mx.array:
        return self.frequency * counts + self.presence * (counts > 0).astype(mx.float32)

    def counts_for_rows(self, n: int, draft: Sequence[int]) -> mx.array:
        """Counts [n, V]: row i = committed output + draft[:i]."""
        if n <= 1 or not draft:
            return mx.broadcast_to(self.counts, (n, self.vocab_size))
        prior = mx.array(list(draft[: n - 1]))
        onehot = (prior[:, None] == mx.arange(self.vocab_size)[None]).astype(mx.float32)
        cum = mx.cumsum(onehot, axis=0)
        cum = mx.concatenate([mx.zeros((1, self.vocab_size)), cum], axis=0)
        return self.counts[None] + cum

    def process(self, logits: mx.array, draft: Sequence[int]) -> tuple[mx.array, int]:
        counts = self.counts_for_rows(int(logits.shape[0]), draft)
        return logits - self._penalty(counts).astype(logits.dtype), len(draft)

    def adjust_proposal(self, logits: mx.array) -> mx.array:
        """The drafter's rows [n, V], penalised by the committed output only: the drafter
        proposes every block position at once, before any of them is known."""
        return logits - self._penalty(self.counts)[None].astype(logits.dtype)

    def commit(self, tokens: Sequence[int]) -> None:
        if tokens:
            self.counts = self.counts.at[mx.array(list(tokens))].add(1.0)

    def forced(self, limit: int) -> list[int]:
        return []

    def stats(self) -> ConstraintStats | None:
        return None  # not an output constraint


class BiasProcessor:
    """OpenAI's `logit_bias`: a fixed value added to the logits of chosen token ids (-100 bans a
    token in practice, +100 all but forces it)."""

    def __init__(self, vocab_size: int, bias: Mapping[int, float]):
        ids = sorted(bias)
        self.bias = (
            mx.zeros((vocab_size,), dtype=mx.float32)
            .at[mx.array(ids)]
            .add(mx.array([float(bias[i]) for i in ids]))
        )

    def process(self, logits: mx.array, draft: Sequence[int]) -> tuple[mx.array, int]:
        return logits + self.bias.astype(logits.dtype), len(draft)

    def adjust_proposal(self, logits: mx.array) -> mx.array:
        return logits + self.bias.astype(logits.dtype)

    def commit(self, tokens: Sequence[int]) -> None:
        return None

    def forced(self, limit: int) -> list[int]:
        return []

    def stats(self) -> ConstraintStats | None:
        return None  # not an output constraint


def sampling_processors(
    params: SamplingParams, vocab_size: int
) -> list[PenaltyProcessor | BiasProcessor]:
    """The processors `params` asks for (none for plain requests, so they cost nothing)."""
    out: list[PenaltyProcessor | BiasProcessor] = []
    if params.frequency_penalty or params.presence_penalty:
        out.append(PenaltyProcessor(vocab_size, params.frequency_penalty, params.presence_penalty))
    if params.logit_bias:
        out.append(BiasProcessor(vocab_size, params.logit_bias))
    return out
