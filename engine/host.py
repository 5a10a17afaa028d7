"""Typed host reads of small MLX arrays (the only places the engine syncs with the device)."""

from __future__ import annotations

from typing import cast

import mlx.core as mx


def host_int(a: mx.array) -> int:
    """A scalar array as a Python int."""
    return int(cast(int, a.item()))


def host_ints(a: mx.array) -> list[int]:
    """A 1-D integer array as a list of Python ints."""
    return cast(list[int], a.tolist())
