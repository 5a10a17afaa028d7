"""Sampled decoding's parts: distribution shaping (temperature, top-k, top-p, min-p), penalty
and bias logits processors, seeded random keys and the exact speculative rejection rule
(`choosers.SamplingChooser` puts them behind the `TokenChooser` seam)."""

from .processors import BiasProcessor, PenaltyProcessor, sampling_processors
from .rejection import rejection_verify
from .rng import KeySchedule
from .shaping import Shaping, shape_logprobs

__all__ = [
    "BiasProcessor",
    "KeySchedule",
    "PenaltyProcessor",
    "Shaping",
    "rejection_verify",
    "sampling_processors",
    "shape_logprobs",
]
