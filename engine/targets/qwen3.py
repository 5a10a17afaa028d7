"""Pure-attention Qwen3 targets (mlx-lm `qwen3`): rollback is a KV trim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from .base import ForwardResult
from .positional import qwen3_attention_at


class Qwen3Target:
    """Walks mlx-lm's Qwen3 decoder layers itself so it can capture hidden states."""

    family = "qwen3"

    def __init__(self, model: Any):
        self.model = model
        self.inner = model.model
        args = model.args
        self.hidden_size = int(args.hidden_size)
        self.num_layers = len(self.inner.layers)
        self.vocab_size = int(self.inner.embed_tokens.weight.shape[0])
        self.tied = bool(args.tie_word_embeddings)

    def make_cache(self) -> list[Any]:
        return [KVCache() for _ in self.inner.layers]

    def embed(self, tokens: mx.array) -> mx.array:
        return self.inner.embed_tokens(tokens)

    def lm_head(self, hidden: mx.array) -> mx.array:
        if self.tied:
            return self.inner.embed_tokens.as_linear(hidden)
        return self.model.lm_head(hidden)

    def forward(
        self,
        tokens: mx.array,
        cache: list[Any],
        capture: Sequence[int] = (),
        keep_tape: bool = False,
        last_logits_only: bool = False,
        position_shift: int = 0,
    ) -> ForwardResult:
        h = self.embed(tokens)
        mask = create_attention_mask(h, cache[0])
        captured = []
        for i, (layer, c) in enumerate(zip(self.inner.layers, cache)):
            if position_shift:
                x = layer.input_layernorm(h)
                h = h + qwen3_attention_at(layer.self_attn, x, mask, c, position_shift)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            else:
                h = layer(h, mask, c)
            if i in capture:
                captured.append(h)
        if last_logits_only:
            h = h[:, -1:]
        logits = self.lm_head(self.inner.norm(h))
        features = _concat_in_order(captured, capture, self.inner.layers)
        return ForwardResult(logits=logits, features=features, tokens=int(tokens.shape[1]))

    def rollback(self, cache: list[Any], result: ForwardResult, keep: int) -> None:
        drop = result.tokens - keep
        if drop > 0:
            for c in cache:
                c.trim(drop)


def _concat_in_order(
    captured: list[mx.array], capture: Sequence[int], layers: Sequence[Any]
) -> mx.array | None:
    """Captured outputs arrive in layer order; reorder them to `capture`'s order."""
    if not capture:
        return None
    by_layer = dict(zip(sorted(set(capture)), captured))
    return mx.concatenate([by_layer[i] for i in capture], axis=-1)
