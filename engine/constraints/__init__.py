"""Output constraints (grammar-constrained decoding): logits processors that mask the target's
logits so the output follows a grammar (JSON Schema, forced tool calls)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api import GenerationRequest
from ..selection import LogitsProcessor


def constraint_processors(request: GenerationRequest, tokenizer: Any) -> Sequence[LogitsProcessor]:
    """The processors enforcing `request`'s output constraint (none yet: requests carry no
    constraint until grammar-constrained decoding lands)."""
    return ()
