"""Log-probabilities of emitted tokens under the target's raw distribution.

Raw means the model's own softmax over its logits, before temperature, penalties, bias,
top-k/top-p/min-p and grammar masks (vLLM's default `raw_logprobs`). The processed
distribution would be degenerate for greedy requests (all mass on one token) and would change
with sampling settings; the raw one tells a client how confident the model was, and is the
same in AR and speculative mode because both score a position with the same target logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import mlx.core as mx


@dataclass(frozen=True)
class RawLogprob:
    """An emitted token's log-probability and the `top` most likely (id, logprob) pairs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: mx.array, tokens: Sequence[int], top: int) -> list[RawLogprob]:
    """Row i of `logits` [n >= len(tokens), V] scored `tokens[i]`; one host sync."""
    n = len(tokens)
    if n == 0:
        return []
    rows = logits[:n].astype(mx.float32)
    logp = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logp, mx.array(list(tokens))[:, None], axis=-1)[:, 0]
    if top > 0:
        k = min(top, int(logp.shape[-1]))
        top_ids = mx.argpartition(-logp, kth=k - 1, axis=-1)[:, :k]
        top_vals = mx.take_along_axis(logp, top_ids, axis=-1)
        mx.eval(chosen, top_ids, top_vals)
        ids = cast(list[list[int]], top_ids.tolist())
        vals = cast(list[list[float]], top_vals.tolist())
    else:
        mx.eval(chosen)
        ids, vals = [[] for _ in range(n)], [[] for _ in range(n)]
    values = cast(list[float], chosen.tolist())
    out = []
    for i, tok in enumerate(tokens):
        pairs = sorted(zip(ids[i], vals[i], strict=True), key=lambda p: -p[1])
        out.append(RawLogprob(int(tok), float(values[i]), tuple(pairs)))
    return out
