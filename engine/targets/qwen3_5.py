"""Qwen3.5/3.6 hybrid targets (mlx-lm `qwen3_5`): GatedDeltaNet + gated attention layers.

Attention layers roll back by KV trim. GatedDeltaNet layers keep a recurrent state and a
convolution state that cannot be trimmed, so decode-time forwards run the GatedDeltaNet layer
through `gated_delta_forward` below, a copy of mlx-lm 0.32's `GatedDeltaNet.__call__` whose
recurrence goes through `toolflash.kernels.gated_delta` and can keep the state after every
step. Prefill runs the same code without the tape. `tests/engine/test_targets.py` pins it to
mlx-lm's layer output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import ArraysCache, KVCache
from mlx_lm.models.gated_delta import compute_g, normalize_qk

from toolflash.kernels import gated_delta

from .base import DecoderStack, ForwardResult
from .positional import qwen3_next_attention_at


@dataclass
class GdnTape:
    """What one GatedDeltaNet layer needs to roll back inside the last forward: to its start
    always (references to arrays the forward computes anyway), to any step with `states`."""

    conv_input: mx.array  # [B, K-1+T, C]: previous conv state followed by this forward's qkv
    prior: mx.array  # recurrent state before the forward
    states: Sequence[mx.array] = ()  # recurrent state after each of the T steps (keep_tape)


def gated_delta_forward(
    layer: Any, x: mx.array, cache: ArraysCache, keep_tape: bool
) -> tuple[mx.array, GdnTape]:
    """mlx-lm's GatedDeltaNet forward for a batch without padding, and its tape (per-step
    states only with `keep_tape`)."""
    b, s, _ = x.shape
    qkv = layer.in_proj_qkv(x)
    z = layer.in_proj_z(x).reshape(b, s, layer.num_v_heads, layer.head_v_dim)
    beta_logits = layer.in_proj_b(x)
    a = layer.in_proj_a(x)
    conv_state = cache[0]
    if conv_state is None:
        conv_state = mx.zeros((b, layer.conv_kernel_size - 1, layer.conv_dim), dtype=x.dtype)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    cache[0] = mx.contiguous(conv_input[:, -(layer.conv_kernel_size - 1) :, :])
    conv_out = nn.silu(layer.conv1d(conv_input))
    q, k, v = [
        t.reshape(b, s, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [layer.key_dim, 2 * layer.key_dim], -1),
            [layer.num_k_heads, layer.num_k_heads, layer.num_v_heads],
            [layer.head_k_dim, layer.head_k_dim, layer.head_v_dim],
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=layer.head_k_dim**-0.5, eps=1e-6)
    state = cache[1]
    if state is None:
        state = mx.zeros((b, layer.num_v_heads, layer.head_v_dim, layer.head_k_dim), mx.float32)
    g = compute_g(layer.A_log, a, layer.dt_bias)
    beta = mx.sigmoid(beta_logits)
    out, states = gated_delta.recurrence(q, k, v, g, beta, state, keep_tape)
    cache[1] = states[-1]
    cache.advance(s)
    out = layer.norm(out, z)
    out = layer.out_proj(out.reshape(b, s, -1))
    return out, GdnTape(conv_input, state, states if keep_tape else ())


class Qwen35Target(DecoderStack):
    """Walks the hybrid stack layer by layer, capturing hidden states and GDN tapes."""

    family = "qwen3_5"

    def __init__(self, model: Any):
        super().__init__(model, model.language_model if hasattr(model, "language_model") else model)
        self.conv_keep = int(self.text.args.linear_conv_kernel_dim) - 1

    def make_cache(self) -> list[Any]:
        return [ArraysCache(size=2) if layer.is_linear else KVCache() for layer in self.layers]

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
        outputs of layers in `capture` (in layer order), and the GatedDeltaNet tapes keyed by
        position in `cache`."""
        # The mask follows the slice's first attention layer's cache (batched caches make an
        # array mask for left-padded rows); a slice of GatedDeltaNet layers only needs none.
        attention = next((c for i, c in zip(layers, cache) if not self.layers[i].is_linear), None)
        mask = create_attention_mask(h, attention)
        kernel = self.kernel_for(mask, h.shape[1])
        captured = []
        tape: dict[int, Any] = {}
        for j, (i, c) in enumerate(zip(layers, cache)):
            layer = self.layers[i]
            x = layer.input_layernorm(h)
            if layer.is_linear:
                r, tape[j] = gated_delta_forward(layer.linear_attn, x, c, keep_tape)
            elif position_shift or kernel is not None:
                attn = layer.self_attn
                r = qwen3_next_attention_at(attn, x, mask, c, position_shift, kernel)
            else:
                r = layer.self_attn(x, mask, c)
            h = h + r
            h = h + self.mlp(layer, layer.post_attention_layernorm(h))
            if i in capture:
                captured.append(h)
        return h, captured, tape

    def rollback(self, cache: list[Any], result: ForwardResult, keep: int) -> None:
        self.rollback_layers(cache, result.tape, result.tokens, keep)

    def rollback_layers(
        self, cache: Sequence[Any], tape: dict[int, Any], tokens: int, keep: int
    ) -> None:
        """Keep the first `keep` of the last forward's `tokens` in `cache` (`tape`: that
        forward's, keyed by position in `cache`)."""
        drop = tokens - keep
        if drop <= 0:
            return
        for j, c in enumerate(cache):
            if isinstance(c, KVCache):
                c.trim(drop)
                continue
            layer_tape: GdnTape = tape[j]
            c[0] = layer_tape.conv_input[:, keep : keep + self.conv_keep, :]
            c[1] = layer_tape.states[keep - 1] if keep > 0 else layer_tape.prior
