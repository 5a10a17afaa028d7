"""Pure-attention Qwen3 targets (mlx-lm `qwen3`): rollback is a KV trim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from .base import DecoderStack, ForwardResult
from .positional import qwen3_attention_at


class Qwen3Target(DecoderStack):
    """Walks mlx-lm's Qwen3 decoder layers itself so it can capture hidden states."""

    family = "qwen3"

    def __init__(self, model: Any):
        super().__init__(model, model)

    def make_cache(self) -> list[Any]:
        return [KVCache() for _ in self.layers]

    def run_layers(
        self,
        h: mx.array,
        layers: range,
        cache: Sequence[Any],
        capture: Sequence[int],
        keep_tape: bool,
        position_shift: int,
    ) -> tuple[mx.array, list[mx.array], dict[int, Any]]:
        """Decoder layers `layers` on `h` (`cache[j]` is layer layers[j]'s): the output, the
        outputs of layers in `capture` (in layer order), and the tape (none: KV trims)."""
        mask = create_attention_mask(h, cache[0])
        kernel = self.kernel_for(mask, h.shape[1])
        captured = []
        for i, c in zip(layers, cache):
            layer = self.layers[i]
            if position_shift or kernel is not None or self.mlp_activation is not None:
                x = layer.input_layernorm(h)
                attn = layer.self_attn
                h = h + qwen3_attention_at(attn, x, mask, c, position_shift, kernel)
                h = h + self.mlp(layer, layer.post_attention_layernorm(h))
            else:
                h = layer(h, mask, c)
            if i in capture:
                captured.append(h)
        return h, captured, {}

    def rollback(self, cache: list[Any], result: ForwardResult, keep: int) -> None:
        self.rollback_layers(cache, result.tape, result.tokens, keep)

    def rollback_layers(
        self, cache: Sequence[Any], tape: dict[int, Any], tokens: int, keep: int
    ) -> None:
        """Keep the first `keep` of the last forward's `tokens` in `cache` (a KV trim)."""
        drop = tokens - keep
        if drop > 0:
            for c in cache:
                c.trim(drop)
