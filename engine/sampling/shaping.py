"""Distribution shaping: processed logits -> the log-probabilities tokens are drawn from.

Order (as Hugging Face's warpers): temperature, then top-k, then top-p, then min-p. Each
filter keeps ties at its threshold, so the result is a deterministic function of the logits
(no order-dependent tie-breaking) and the same rule applies row by row to the drafter's
proposal rows, the target's verify rows and the AR step.
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


def shape_logprobs(logits: mx.array, shaping: Shaping) -> mx.array:
    """Log-probabilities [..., V] of the shaped distribution (-inf outside its support)."""
    x = logits.astype(mx.float32) / shaping.temperature
    vocab = x.shape[-1]
    neg_inf = mx.array(-mx.inf, dtype=x.dtype)
    if 0 < shaping.top_k < vocab:
        kth = mx.min(mx.topk(x, shaping.top_k, axis=-1), axis=-1, keepdims=True)
        x = mx.where(x < kth, neg_inf, x)
    if shaping.top_p < 1.0:
        # The smallest set of most likely tokens whose mass reaches top_p: a token stays when
        # the mass strictly before it (in descending order) is below top_p.
        order = mx.argsort(-x, axis=-1)
        sorted_x = mx.take_along_axis(x, order, axis=-1)
        sorted_p = mx.softmax(sorted_x, axis=-1)
        before = mx.cumsum(sorted_p, axis=-1) - sorted_p
        kept = mx.where(before < shaping.top_p, sorted_x, mx.inf)
        threshold = mx.min(kept, axis=-1, keepdims=True)
        x = mx.where(x < threshold, neg_inf, x)
    if shaping.min_p > 0.0:
        # p >= min_p * p_max  <=>  logit >= max_logit + log(min_p)
        floor = mx.max(x, axis=-1, keepdims=True) + math.log(shaping.min_p)
        x = mx.where(x < floor, neg_inf, x)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)
