"""Builds the `TokenChooser` a request decodes with: the sampling rule plus the logits
processors its fields ask for (penalties, bias, output constraints)."""

from __future__ import annotations

from typing import Any

from ..api import GenerationRequest
from ..constraints import constraint_processors
from ..sampling import sampling_processors
from .base import LogitsProcessor, TokenChooser
from .greedy import GreedyChooser
from .sampled import SamplingChooser


def build_chooser(request: GenerationRequest, vocab_size: int, tokenizer: Any) -> TokenChooser:
    """The chooser for `request` over a vocabulary of `vocab_size` logits."""
    processors: list[LogitsProcessor] = []
    processors.extend(constraint_processors(request, tokenizer))
    # Penalties and bias apply after the grammar mask (a masked token stays at -inf).
    own = sampling_processors(request.sampling, vocab_size)
    processors.extend(own)
    if request.sampling.greedy:
        return GreedyChooser(processors)
    return SamplingChooser(request.sampling, processors, own)
