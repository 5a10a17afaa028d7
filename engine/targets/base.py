"""The `TargetAdapter` protocol: what the session needs from a target model family."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx


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
        must have been run with keep_tape=True and be the last forward on `cache`)."""
        ...


def cache_offset(cache: list[Any]) -> int:
    """Tokens held by a session cache (read from its first attention layer)."""
    for c in cache:
        if hasattr(c, "offset"):
            return int(c.offset)
    raise ValueError("cache has no attention layer")
