"""Distribution shaping: processed logits -> the distribution tokens are drawn from.

Order (as Hugging Face's warpers): temperature, then top-k, then top-p, then min-p. Each
filter keeps ties at its threshold, so the result is a deterministic function of the logits
(no order-dependent tie-breaking) and the same rule applies row by row to the drafter's
proposal rows, the target's verify rows and the AR step.

Cost matters on CPU, where MLX's transcendental ops run at ~10 ns per element: the filters
work on logits (thresholds, no exp), the distribution takes one exp pass, and drawing uses
the inverse CDF (one uniform per row) instead of Gumbel noise over the whole vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from ..api import SamplingParams


@dataclass(frozen=True)
class Shaping:
    """The distribution-shaping part of `SamplingParams` (temperature > 0)."""

    temperature: float
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off

    @classmethod
    def of(cls, params: SamplingParams) -> Shaping:
        return cls(params.temperature, params.top_k, params.top_p, params.min_p)


def shape_logits(logits: mx.array, shaping: Shaping) -> mx.array:
    """Tempered logits [..., V] with -inf outside the shaped distribution's support."""
    x = logits.astype(mx.float32) / shaping.temperature
    vocab = x.shape[-1]
    neg_inf = mx.array(-mx.inf, dtype=x.dtype)
    top_k = shaping.top_k if 0 < shaping.top_k < vocab else 0
    if top_k or shaping.top_p < 1.0:
        # Candidates in descending order: the top-k (cheap) or, for top-p alone, all tokens.
        cand = mx.topk(x, top_k, axis=-1) if top_k else x
        cand = -mx.sort(-cand, axis=-1)
        if top_k:
            x = mx.where(x < cand[..., -1:], neg_inf, x)
        if shaping.top_p < 1.0:
            # The smallest prefix of candidates whose mass reaches top_p: a candidate stays
            # when the mass strictly before it is below top_p (the first always stays).
            w = mx.exp(cand - cand[..., :1])
            cum = mx.cumsum(w, axis=-1)
            before = (cum - w) / cum[..., -1:]
            first = mx.arange(cand.shape[-1]) == 0
            kept = mx.where((before < shaping.top_p) | first, cand, mx.inf)
            x = mx.where(x < mx.min(kept, axis=-1, keepdims=True), neg_inf, x)
    if shaping.min_p > 0.0:
        # p >= min_p * p_max  <=>  logit >= max_logit + log(min_p)
        floor = mx.max(x, axis=-1, keepdims=True) + math.log(shaping.min_p)
        x = mx.where(x < floor, neg_inf, x)
    return x


def weights(x: mx.array) -> mx.array:
    """Unnormalised probabilities exp(x - max) of shaped logits (one exp pass)."""
    return mx.exp(x - mx.max(x, axis=-1, keepdims=True))


def shape_probs(logits: mx.array, shaping: Shaping) -> mx.array:
    """Probabilities [..., V] of the shaped distribution."""
    w = weights(shape_logits(logits, shaping))
    return w / w.sum(axis=-1, keepdims=True)


def shape_logprobs(logits: mx.array, shaping: Shaping) -> mx.array:
    """Log-probabilities [..., V] of the shaped distribution (-inf outside its support)."""
    x = shape_logits(logits, shaping)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def sample(w: mx.array, key: mx.array) -> mx.array:
    """One draw per row from non-negative weights [..., V] (need not sum to 1), by the
    inverse CDF: the first index whose cumulative weight exceeds u * total."""
    cum = mx.cumsum(w.astype(mx.float32), axis=-1)
    total = cum[..., -1:]
    u = mx.random.uniform(shape=cum.shape[:-1], key=key)[..., None] * total
    # u * total can round up to the total itself; below it the first index past u always
    # has positive weight (zero-weight tokens repeat the previous cumulative value).
    u = mx.where(u >= total, total * (1 - 1e-6), u)
    return (cum <= u).astype(mx.int32).sum(axis=-1)
