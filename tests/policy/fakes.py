"""A settable clock and synthetic cycle records for policy tests."""

from __future__ import annotations

from toolflash.engine.api import CycleRecord


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def spec_record(
    index: int, block: int, accepted: int, seconds: float, ctx: int = 300
) -> CycleRecord:
    return CycleRecord(
        index=index,
        mode="spec",
        block_size=block,
        drafted=block - 1,
        accepted=accepted,
        committed=accepted + 1,
        draft_s=seconds / 3,
        verify_s=seconds * 2 / 3,
        rollback_s=0.0,
        context_len=ctx,
    )


def ar_record(index: int, seconds: float, ctx: int = 300) -> CycleRecord:
    return CycleRecord(
        index=index,
        mode="ar",
        block_size=1,
        drafted=0,
        accepted=0,
        committed=1,
        draft_s=0.0,
        verify_s=seconds,
        rollback_s=0.0,
        context_len=ctx,
    )


def lookup_record(index: int, committed: int, seconds: float, ctx: int = 300) -> CycleRecord:
    """A lookup step that committed `committed` tokens (1: no match, an AR step)."""
    drafted = committed - 1 if committed > 1 else 0
    return CycleRecord(
        index=index,
        mode="lookup",
        block_size=drafted + 1,
        drafted=drafted,
        accepted=drafted,
        committed=committed,
        draft_s=0.0,
        verify_s=seconds,
        rollback_s=0.0,
        context_len=ctx,
    )
