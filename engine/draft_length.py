"""How many tokens the next speculative cycle drafts when no policy decides it.

A cycle's cost grows with its block (tiny hybrid pair on the 2-core CPU: block 16 ~11 ms,
block 2 ~7 ms, an AR step ~4 ms), but a cycle whose draft is rejected at its first token
commits one token whatever the block. Where the target's output leaves the drafter's reach
(a model reciting text it memorised, an unusual tool call) a fixed 16-token block pays the
full price for one token each cycle. The adaptive schedule halves the block after a cycle that
accepted nothing and doubles it after one that accepted its whole draft (the additive and
multiplicative schedules of assisted generation are the same idea), so a collapse costs a
small block and a recovery is back at full size in three cycles. Lossless either way: the
block only decides how much is verified.
"""

from __future__ import annotations

from .api import CycleRecord, DraftLength

__all__ = ["DraftLength", "DraftLengthSchedule", "MIN_BLOCK"]

# The smallest block that still drafts (a block of 1 is an AR step).
MIN_BLOCK = 2


class DraftLengthSchedule:
    """Block size of the next cycle: `max_block` to start, then halved after a drafted cycle
    that accepted nothing and doubled after one that accepted every drafted token."""

    def __init__(self, max_block: int, min_block: int = MIN_BLOCK):
        self.max_block = max_block
        self.min_block = min(min_block, max_block)
        self.block = max_block

    def observe(self, record: CycleRecord) -> None:
        """Update from a finished cycle. Only the drafter's own proposals count: AR steps,
        grammar-forced runs and drafts a constraint cut short say nothing of its reach."""
        if record.mode != "spec" or record.forced or record.draft_cut or record.drafted == 0:
            return
        if record.accepted >= record.drafted:
            self.block = min(self.max_block, self.block * 2)
        elif record.accepted == 0:
            self.block = max(self.min_block, self.block // 2)
