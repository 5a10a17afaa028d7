"""Sampled decoding: distribution shaping (temperature, top-k, top-p, min-p), penalty and bias
logits processors, seeded random keys, the exact speculative rejection rule and the
`SamplingChooser` that puts them behind the `TokenChooser` seam."""

from .chooser import SamplingChooser
from .processors import BiasProcessor, PenaltyProcessor, sampling_processors
from .rejection import rejection_verify
from .rng import KeySchedule
from .shaping import Shaping, shape_logprobs

__all__ = [
    "BiasProcessor",
    "KeySchedule",
    "PenaltyProcessor",
    "SamplingChooser",
    "Shaping",
    "rejection_verify",
    "sampling_processors",
    "shape_logprobs",
]
