"""Which mode and block each decode step of one generation runs.

The request sets the mode to start in (`mode`, and `mode_plan` to script switches at cycle
indices); a `ModeController` (the adaptive policy), when there is one, decides between steps
and replaces both; the adaptive draft length (`DraftLengthSchedule`) shortens the decided block
after rejected drafts. `ModeControl` holds these for the request loop (`lane.Lane`), so the loop
only asks what the next step runs and reports what it did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

from .api import (
    CycleRecord,
    DraftLength,
    GenerationRequest,
    GenerationStats,
    Mode,
    ModeController,
    ModeDecision,
)
from .draft_length import DraftLengthSchedule, scheduled_block
from .session import GenerationSession

# Starts a controller's `prepare` off the decode path (the engine's preparer thread).
Submit = Callable[..., "Future[None]"]


class ModeControl:
    """One generation's mode and block, step by step."""

    def __init__(
        self,
        request: GenerationRequest,
        controller: ModeController | None,
        *,
        spec_block: int,
        lookup_block: int,
        drafter: bool,
        draft_length: DraftLength,
    ) -> None:
        self.request = request
        self.controller = controller
        self.drafter = drafter
        self.mode = self._runnable(request.mode)
        self.block = lookup_block if self.mode == "lookup" else spec_block
        # The arms a controller may choose from: spec up to the drafter's block (0: none),
        # lookup at its block.
        self.arm_blocks = (spec_block if drafter else 0, lookup_block)
        # The block (the controller's, else the request's or engine's) is the largest a cycle
        # drafts; the adaptive draft length shortens it after rejected drafts.
        self.schedule = DraftLengthSchedule(self.block) if draft_length == "adaptive" else None
        self.steps = 0
        self._prepared: Future[None] | None = None

    def _runnable(self, mode: Mode) -> Mode:
        """`mode`, or AR for spec without a drafter (lookup needs none)."""
        return "ar" if mode == "spec" and not self.drafter else mode

    def _planned(self) -> Mode:
        """The next step's mode: the request's plan at this step, else the current mode."""
        return self._runnable(self.request.mode_plan.get(self.steps, self.mode))

    def _block(self, remaining: int) -> int:
        return min(scheduled_block(self.schedule, self.block), remaining)

    def _decide(self, decision: ModeDecision) -> None:
        self.mode, self.block = decision.mode, decision.block_size

    # -- around the prefill -----------------------------------------------------------------
    def prepare(self, prompt_tokens: int, submit: Submit) -> None:
        """Start the controller's reads for the first decisions (they run beside the prefill)."""
        if self.controller is not None:
            self._prepared = submit(self.controller.prepare, prompt_tokens, *self.arm_blocks)

    def start(self, prompt_tokens: int, first_text: str) -> None:
        """The controller's first decision, once the prefill chose the first token (whose text
        may already open a span: `<tool_call>`, `<think>`, `{`)."""
        if self.controller is None or self._prepared is None:
            return
        self._prepared.result()  # done by now: it ran beside the prefill
        self.controller.observe_prefix(first_text)
        self._decide(self.controller.start(prompt_tokens, *self.arm_blocks))

    # -- between steps ----------------------------------------------------------------------
    def next_step(self, remaining: int) -> tuple[Mode, int]:
        """The next step's mode (the request's plan overrides at its cycle index) and block."""
        self.mode = self._planned()
        return self.mode, self._block(remaining)

    def after_step(
        self, record: CycleRecord, tokens: Sequence[int], text: str, judged: bool = True
    ) -> None:
        """Count the step and let the draft length and the controller see it. A step the
        controller must not judge (`judged` False: a row of a batched forward, whose cost is
        the batch's, while the surplus it learns is per request running alone) only counts."""
        self.steps += 1
        if self.schedule is not None:
            self.schedule.observe(record)
        if judged and self.controller is not None:
            self._decide(self.controller.after_step(record, tokens, text))

    def prepare_next(self, session: GenerationSession, remaining: int) -> None:
        """Start the next step's device work before the event goes out, so it computes while
        the consumer handles the event (`GenerationSession.prepare`)."""
        session.prepare(self._planned(), self._block(remaining))

    def finish(self, stats: GenerationStats) -> None:
        if self.controller is not None:
            self.controller.finish(stats)
