"""Builds the `TokenChooser` a request decodes with: the sampling rule plus the logits
processors its fields ask for (penalties, bias, output constraints)."""

from __future__ import annotations

from .api import GenerationRequest
from .selection import GreedyChooser, LogitsProcessor, TokenChooser


def build_chooser(request: GenerationRequest, vocab_size: int) -> TokenChooser:
    """The chooser for `request` over a vocabulary of `vocab_size` logits."""
    processors: list[LogitsProcessor] = []
    if not request.sampling.greedy:
        raise NotImplementedError("sampled decoding is not implemented yet")
    return GreedyChooser(processors)
