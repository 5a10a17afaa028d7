"""toolflash: an OpenAI-compatible gateway for coding agents with DFlash speculative decoding
on MLX and an adaptive fallback to target-only decoding."""

__version__ = "0.1.0"
