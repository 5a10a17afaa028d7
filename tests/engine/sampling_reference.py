"""A NumPy reference of the processed target distribution (penalties, bias, temperature,
top-k, top-p, min-p), written from the definitions, to check the MLX implementation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def reference_probs(
    logits: np.ndarray,
    output: Sequence[int] = (),
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    logit_bias: Mapping[int, float] | None = None,
) -> np.ndarray:
    """Probabilities [V] for one row of raw logits, after `output` tokens were generated."""
    x = logits.astype(np.float64).copy()
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=len(x)).astype(float)
    x -= frequency_penalty * counts + presence_penalty * (counts > 0)
    for tok, b in (logit_bias or {}).items():
        x[tok] += b
    x /= temperature
    keep = np.ones_like(x, dtype=bool)
    if 0 < top_k < len(x):
        keep &= x >= np.sort(x)[::-1][top_k - 1]
    x = np.where(keep, x, -np.inf)
    if top_p < 1.0:
        p = np.exp(x - x.max())
        p /= p.sum()
        order = np.argsort(-x, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        kept = order[(before < top_p) | (np.arange(len(x)) == 0)]
        threshold = x[kept].min()
        x = np.where(x >= threshold, x, -np.inf)
    if min_p > 0.0:
        p = np.exp(x - x.max())
        x = np.where(p >= min_p, x, -np.inf)
    p = np.exp(x - x.max())
    return p / p.sum()
