"""How many tokens the next speculative cycle drafts, at most the block (the policy's decision,
else the request's or the engine's).

A cycle's cost grows with its block (tiny hybrid pair on the 2-core CPU: block 16 ~11 ms,
block 2 ~7 ms, an AR step ~4 ms), but a cycle whose draft is rejected at its first token
commits one token whatever the block. Where the target's output leaves the drafter's reach
(a model reciting text it memorised, an unusual tool call) a fixed 16-token block pays the
full price for one token each cycle. The adaptive schedule halves the block once two cycles
in a row accepted nothing (and at each further one), and doubles it after a cycle that
accepted its whole draft (the schedules of assisted generation are the same idea): a collapse
costs a small block, and a recovery is back at full size in three cycles. One rejected cycle
alone does not shrink it: in free text and JSON a fully rejected draft between two long
accepted runs is common, and halving there truncated the next run (30 held-out prompts per
kind, pooled: halving at the first rejection 2.61x free text / 3.59x JSON, at the second
2.69x / 3.74x, fixed 2.63x / 3.61x; code 2.03x / 2.07x / 1.71x). Lossless either way: the
block only decides how much is verified.
"""

from __future__ import annotations

from .api import CycleRecord

# The smallest block that still drafts (a block of 1 is an AR step).
MIN_BLOCK = 2
# Drafted cycles in a row that accepted nothing before the block shrinks.
REJECTIONS_TO_SHRINK = 2


class DraftLengthSchedule:
    """Block size of the next cycle under a ceiling (the block the caller decided): the
    ceiling to start, halved at each drafted cycle that accepted nothing once
    `REJECTIONS_TO_SHRINK` did in a row, doubled (up to the ceiling) after one that accepted
    every drafted token. A new ceiling (a policy's new decision) starts afresh."""

    def __init__(self, ceiling: int, min_block: int = MIN_BLOCK):
        self.min_block = min_block
        self.ceiling = ceiling
        self.block = ceiling
        self.rejected_in_a_row = 0

    def next_block(self, ceiling: int) -> int:
        """The block for the next cycle when the caller's block is `ceiling`."""
        if ceiling != self.ceiling:
            self.ceiling = ceiling
            self.restart()
        return self.block

    def restart(self) -> None:
        """Back to the ceiling (a new span, or spec again after AR steps: what the drafter
        missed before says little about what comes next)."""
        self.block = self.ceiling
        self.rejected_in_a_row = 0

    def observe(self, record: CycleRecord) -> None:
        """Update from a finished cycle. An AR step restarts (the next spec cycle is a fresh
        choice of the caller's). Otherwise only the drafter's own proposals count:
        grammar-forced runs and drafts a constraint cut short say nothing of its reach."""
        if record.mode == "ar":
            self.restart()
            return
        if record.forced or record.draft_cut or record.drafted == 0:
            return
        self.rejected_in_a_row = self.rejected_in_a_row + 1 if record.accepted == 0 else 0
        if record.accepted >= record.drafted:
            self.block = min(self.ceiling, self.block * 2)
        elif self.rejected_in_a_row >= REJECTIONS_TO_SHRINK:
            self.block = max(min(self.min_block, self.ceiling), self.block // 2)


def scheduled_block(schedule: DraftLengthSchedule | None, ceiling: int) -> int:
    """The next cycle's block under the caller's `ceiling` (the adaptive draft length's, when
    there is a schedule)."""
    return ceiling if schedule is None else schedule.next_block(ceiling)
