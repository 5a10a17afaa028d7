"""Adaptive decoding policy: request classes, surplus estimates, mode decisions."""
