"""How one decode step's measurement reaches the estimates, and a controller that only measures.

`observe_step` is the rule the adaptive controller applies to every step it observes (which
step feeds tau, which the cycle or AR timing, which the forced-run tables). `ScriptedController`
runs one arm through a whole generation (spec at one block, or AR) and measures each step by the
same rule: calibration (`toolflash calibrate`) drives it, so the estimates it seeds are exactly
what online learning would have made of the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from toolflash.engine.api import CycleRecord, GenerationStats, ModeDecision
from toolflash.policy.request_class import RequestClass

from .config import EffectivePolicy
from .decide import Arm
from .estimates import Estimates
from .spans import SpanTracker


def step_seconds(record: CycleRecord, now: float, last: float, wall: bool) -> float:
    """The seconds a step counts for: its cycle time, or with `wall` timing the time since the
    previous step, since per-step work outside the cycle (detokenizing, stop matching, the
    controller, event delivery) is paid per step and spec amortizes it. Clipped at twice the
    cycle, so a consumer that stalls between events does not read as slow decoding."""
    if not wall:
        return record.total_s
    return min(now - last, 2.0 * record.total_s) or record.total_s


def observe_step(
    est: Estimates,
    policy: EffectivePolicy,
    model_id: str,
    label: str,
    record: CycleRecord,
    span: str,
    seconds: float,
    arm: Arm,
    selected: bool = False,
    settling: bool = False,
    first_lookup: bool = False,
) -> None:
    """One step's measurement into the estimates; `arm` is the one it ran under, `selected`
    whether this request's own acceptance chose it (then it is no measure of the class),
    `settling` whether it is one of the arm's first `settle_steps`: its tokens are learned, its
    time is not (it carries one-off costs of the change, not the arm's per-step cost);
    `first_lookup` whether it is the request's first lookup step in this span and block (the
    request counts toward lookup's samples there, `Estimates.lookup`)."""
    mode = record.mode
    # A cycle cut short by max_tokens ran a smaller block than decided: not comparable.
    full = mode == "ar" or record.block_size == arm[1]
    if selected:
        seconds = 0.0  # selected by this request's acceptance: not the class's measure
    timed = None if settling else seconds
    if mode == "lookup" or arm[0] == "lookup":
        # Lookup is measured whole (hits, misses and grammar-forced runs alike), and only
        # under its own arm: a step of another mode under it (a scripted plan) says nothing.
        if seconds > 0 and mode == arm[0] and record.block_size <= arm[1]:
            est.observe_lookup(model_id, label, span, arm[1], record.committed, timed, first_lookup)
        return
    if seconds > 0 and record.forced > 0:
        # A grammar-forced run: no drafter, one forward of the fixed stretch (a spec cycle
        # shorter than the block, or an AR step that committed the run and one more token).
        # Not a measure of the drafter's tau, a block's cycle time or a one-token AR step,
        # but part of what either arm delivers here: each arm's estimate mixes its forced
        # runs in at their measured share (Estimates.with_forced, Estimates.ar).
        est.observe_forced(
            model_id,
            label,
            span,
            record.committed,
            timed,
            mode,
            block_size=arm[1] if mode == "spec" else None,
        )
    elif (
        seconds > 0
        and mode == "spec"
        and record.drafted > 0
        and arm[0] == "spec"
        and record.block_size <= arm[1]
        and (record.draft_cut or (record.block_size < arm[1] and record.accepted < record.drafted))
    ):
        # A cycle shorter than the arm's block that says what the block would have
        # committed: the grammar ended the draft (nothing further allowed), or the draft
        # missed inside a block that the engine's adaptive draft length shrank after
        # rejected drafts (or that max_tokens cut). A shorter draft accepted whole says
        # only "at least this much": left out. Leaving the shrunk cycles out altogether
        # kept the first two cycles of a stretch where drafts miss and every cycle where
        # they land, so a span where most of the class's drafts missed still read as
        # paying; dropping grammar-cut drafts biased constrained spans' tau down. The
        # time is a shorter block's, not a measure of the arm's block.
        rule = policy.rule(label, span)
        est.observe_spec(
            model_id,
            label,
            span,
            arm[1],
            record.accepted,
            None,
            record.context_len,
            rule.block_sizes,
        )
    elif seconds > 0 and full:
        if mode == "spec" and record.drafted > 0:
            rule = policy.rule(label, span)
            est.observe_spec(
                model_id,
                label,
                span,
                record.block_size,
                record.accepted,
                timed,
                record.context_len,
                rule.block_sizes,
            )
        elif mode == "ar":
            scope = (model_id, label, span)
            est.observe_ar(model_id, timed, record.context_len, scope)


class FirstLookups:
    """Which steps are a request's first lookup step in their span and block (each counts the
    request toward lookup's samples there, `Estimates.lookup`)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int]] = set()

    def first(self, arm: Arm, span: str, mode: str) -> bool:
        """Whether a step of `mode` run under `arm` in `span` is the first such lookup step."""
        if arm[0] != "lookup" or mode != "lookup" or (span, arm[1]) in self._seen:
            return False
        self._seen.add((span, arm[1]))
        return True


class ScriptedController:
    """A `ModeController` that runs `arm` throughout and measures every step into `est` by
    `observe_step`, with the span tracking and step timing of the adaptive controller. It
    decides nothing, counts nothing and saves nothing; the measurements are queued and added
    at `finish`, as the adaptive controller keeps estimate work off the decode steps."""

    def __init__(
        self,
        est: Estimates,
        policy: EffectivePolicy,
        model_id: str,
        request_class: RequestClass,
        arm: Arm,
        *,
        json_output: bool,
        start_in_reasoning: bool,
    ) -> None:
        self.est = est
        self.policy = policy
        self.model_id = model_id
        self.label = request_class.label
        self.arm = arm
        self.spans = SpanTracker(json_output=json_output, start_in_reasoning=start_in_reasoning)
        self.wall = policy.estimates.timing == "wall"
        self.decision = ModeDecision(arm[0], arm[1], "calibration")
        self._last = 0.0
        self._queued: list[tuple[CycleRecord, str, float]] = []
        # Steps per span kind, for the caller's report.
        self.steps: dict[str, int] = {}

    def prepare(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> None:
        return None

    def observe_prefix(self, text: str) -> None:
        self.spans.push(text)

    def start(
        self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0
    ) -> ModeDecision:
        self._last = time.perf_counter()
        return self.decision

    def after_step(self, record: CycleRecord, token_ids: Sequence[int], text: str) -> ModeDecision:
        now = time.perf_counter()
        seconds = step_seconds(record, now, self._last, self.wall)
        self._last = now
        span = self.spans.kind
        self._queued.append((record, span, seconds))
        self.steps[span] = self.steps.get(span, 0) + 1
        if text:
            self.spans.push(text)
        return self.decision

    def finish(self, stats: GenerationStats) -> None:
        queued, self._queued = self._queued, []
        settle = self.policy.estimates.settle_steps
        lookups = FirstLookups()
        for i, (record, span, seconds) in enumerate(queued):
            first = lookups.first(self.arm, span, record.mode)
            observe_step(
                self.est,
                self.policy,
                self.model_id,
                self.label,
                record,
                span,
                seconds,
                self.arm,
                settling=i < settle,
                first_lookup=first,
            )
        self.est.flush_pooled()
