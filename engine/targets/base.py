"""The `TargetAdapter` protocol: what the session needs from a target model family."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx

from toolflash.kernels.attention import (
    SHORT_QUERIES,
    Attention,
    attention,
    composed_attention,
    composed_attention_enabled,
    fast_attention_enabled,
)
from toolflash.kernels.training_math import TrainingMath


@dataclass
class ForwardResult:
    """Output of one target forward over T tokens.

    `features` is the concatenation of the captured layer outputs ([1, T, len(ids)*H]) or None.
    `tape` holds whatever the family needs to roll the cache back to any of the T positions
    (empty for pure-attention targets, whose KV cache is simply trimmed)."""

    logits: mx.array
    features: mx.array | None
    tokens: int
    tape: dict[int, Any] = field(default_factory=dict)


class TargetAdapter(Protocol):
    """One model family's way of running the target inside a session."""

    family: str
    model: Any
    hidden_size: int
    num_layers: int
    vocab_size: int

    def make_cache(self) -> list[Any]:
        """Fresh per-layer caches."""
        ...

    def embed(self, tokens: mx.array) -> mx.array:
        """Token ids [B, T] -> input embeddings [B, T, H] (the drafter borrows this)."""
        ...

    def lm_head(self, hidden: mx.array) -> mx.array:
        """Final-normed hidden states -> logits (the drafter borrows this)."""
        ...

    def forward(
        self,
        tokens: mx.array,
        cache: list[Any],
        capture: Sequence[int] = (),
        keep_tape: bool = False,
        last_logits_only: bool = False,
        position_shift: int = 0,
    ) -> ForwardResult:
        """Run tokens [1, T] through the target, appending to `cache`; capture the outputs
        of decoder layers `capture`; with `keep_tape`, keep what `rollback` needs. A nonzero
        `position_shift` rotates attention at cache length + shift (sparse sessions)."""
        ...

    def rollback(self, cache: list[Any], result: ForwardResult, keep: int) -> None:
        """Make `cache` hold only the first `keep` tokens of the forward `result` (which
        must be the last forward on `cache`, run with keep_tape=True unless `keep` is 0)."""
        ...


# Below this many mask entries (rows x queries x keys) a batched forward costs the same with
# either kernel on the 2-core CPU; above it toolflash's is 1.3-1.9x faster (8 rows x 16 queries
# over 700 keys of the tiny qwen3 pair: 37 against 62 ms a forward).
SMALL_ARRAY_MASK = 2048


class DecoderStack(ABC):
    """What the Qwen families share: an mlx-lm text model (`text.model` holds the embedding,
    the layers and the final norm), tied or separate lm_head, and feature capture."""

    def __init__(self, model: Any, text: Any):
        self.model = model
        self.text = text
        self.inner = text.model
        self.layers = list(self.inner.layers)
        args = text.args
        self.hidden_size = int(args.hidden_size)
        self.num_layers = len(self.layers)
        self.vocab_size = int(self.inner.embed_tokens.weight.shape[0])
        self.tied = bool(args.tie_word_embeddings)
        # The attention kernel for attention layers: toolflash's on the CPU (a fast
        # softmax), None = MLX's fused kernel through the layer's own forward.
        self.attention_kernel: Attention | None = attention if fast_attention_enabled() else None
        # The kernel for forwards of a few queries (verify and draft blocks): composed on
        # CUDA, where MLX's fused call builds a cuDNN graph for every new key length.
        self.short_query_kernel: Attention | None = (
            composed_attention if composed_attention_enabled() else None
        )
        # The MLP's activation: None = the layer's own MLP (mlx-lm's SwiGLU); training sets
        # toolflash's CPU-fast SiLU (`training_logits`).
        self.mlp_activation: Callable[[mx.array], mx.array] | None = None

    def kernel_for(self, mask: Any, queries: int) -> Attention | None:
        """The attention kernel for a forward of `queries` tokens a row with `mask`: the
        short-query kernel for a few queries where there is one; else toolflash's, unless the
        mask is a small array (a few left-padded batch rows over few keys), where MLX's fused
        call's lower overhead wins. Decided per forward, not by switching the adapter, so
        forwards on two threads never see each other's choice."""
        if self.short_query_kernel is not None and 1 < queries <= SHORT_QUERIES:
            return self.short_query_kernel
        if isinstance(mask, mx.array) and mask.size < SMALL_ARRAY_MASK:
            return None
        return self.attention_kernel

    def embed(self, tokens: mx.array) -> mx.array:
        return self.inner.embed_tokens(tokens)

    def lm_head(self, hidden: mx.array) -> mx.array:
        if self.tied:
            return self.inner.embed_tokens.as_linear(hidden)
        return self.text.lm_head(hidden)

    def mlp(self, layer: Any, x: mx.array) -> mx.array:
        """The layer's SwiGLU MLP on `x` (its input, already normalized)."""
        if self.mlp_activation is None:
            return layer.mlp(x)
        mlp = layer.mlp
        return mlp.down_proj(self.mlp_activation(mlp.gate_proj(x)) * mlp.up_proj(x))

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
        h, captured, tape = self.run_layers(
            h, range(self.num_layers), cache, capture, keep_tape, position_shift
        )
        return ForwardResult(
            logits=self.finish(h, last_logits_only),
            features=features_in_order(captured, capture),
            tokens=int(tokens.shape[1]),
            tape=tape,
        )

    @abstractmethod
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
        outputs of layers in `capture` (in layer order), and what rollback needs (the tape)."""

    def finish(self, h: mx.array, last_logits_only: bool) -> mx.array:
        """Logits from the last layer's output."""
        if last_logits_only:
            h = h[:, -1:]
        return self.lm_head(self.inner.norm(h))


def training_logits(adapter: Any, tokens: mx.array, ops: TrainingMath) -> mx.array:
    """Logits of a batch of unpadded sequences [B, T] through `adapter` (a `DecoderStack`
    built for this call on the model being trained: its attention and MLP activation are set
    to `ops`') with fresh caches. This is the function mlx-lm's forward computes, in
    differentiable MLX ops that run fast on the CPU (`toolflash.kernels.training_math`; the
    hybrid's recurrence in toolflash's chunked form, not mlx-lm's loop over every position)."""
    adapter.attention_kernel = ops.attention
    adapter.mlp_activation = ops.silu
    return adapter.forward(tokens, adapter.make_cache()).logits


def features_in_order(captured: list[mx.array], capture: Sequence[int]) -> mx.array | None:
    """Captured layer outputs arrive in layer order; concatenate them in `capture`'s order."""
    if not capture:
        return None
    by_layer = dict(zip(sorted(set(capture)), captured))
    return mx.concatenate([by_layer[i] for i in capture], axis=-1)


def cache_offset(cache: list[Any]) -> int:
    """Tokens held by a session cache (read from its first attention layer)."""
    for c in cache:
        if hasattr(c, "offset"):
            return int(c.offset)
    raise ValueError("cache has no attention layer")
