"""The adaptive decoding policy's per-request `PolicyController` (`AdaptivePolicy`, adaptive.py, is
the process-wide part that makes one per request).

The engine calls the controller between cycles (`engine.api.ModeController`). Each step feeds the
estimates (spec cycle: tokens per cycle and seconds per cycle; AR step: seconds per token), moves
the span tracker over the committed text, and decides the next mode and block size:
- at request start, and whenever the span kind changes, the best-known arm for the new span
  (AR, or spec at one of the configured block sizes) is chosen; entering a tool call thus goes to
  AR when the tool-call surplus is negative, and leaving it returns to spec when text pays;
- inside a span the choice is rechecked every `recheck_every` steps (twice as late while
  rechecks change nothing, up to `recheck_max`);
- hysteresis: leaving the current arm needs the other to be faster by `switch_margin` with
  confidence `min_confidence`, and (inside a span) `min_dwell` steps in the current arm;
- trials (`trial.py`): a probe of another arm where an estimate is uncertain, and of the next
  larger block where the current one keeps accepting whole blocks (a grow probe); where the class
  says AR, an opening spec cycle at the request's start and at each span it enters, kept when
  this request's own acceptance beats AR (`request_evidence.py`); and, where this request's own
  cycles moved a span to AR (`request_evidence_cycles`, off by default), retry cycles.
The decisions themselves are pure functions (`decide.py`); the estimate reads and queued
measurements are `StepReads` (`reads.py`); a request's trials, and what its own acceptance
decided, are `RequestTrials` (`request_trials.py`); this module tracks spans and dispatches each step.
The block decided here is the largest a cycle drafts: the engine's adaptive draft length
(`engine/draft_length.py`) shortens it after rejected drafts inside a spec stretch. Every
decision is a `DecisionRecord` (`record.py`): listed (`records`), logged and counted at `finish`,
which the engine calls after the response's last event.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog

from toolflash.engine.api import CycleRecord, GenerationStats, ModeDecision
from toolflash.policy.request_class import RequestClass

from . import decide
from .config import SpanRule
from .decide import AR, Arm, Choice
from .measure import step_seconds
from .reads import StepReads
from .record import DecisionRecord, DecisionRecords
from .request_trials import RequestTrials
from .spans import SPAN_KINDS, SpanTracker
from .throughput import Surplus

if TYPE_CHECKING:
    from .adaptive import AdaptivePolicy, ModelState

log = structlog.get_logger(__name__)

# Span entries within a request's first steps choose from the reads `prepare` made.
_PREPARED_STEPS = 8
# Decisions recorded (and dwell reset) even when they keep the arm.
_RECORDED_KINDS = frozenset(
    ("start", "probe", "probe-won", "probe-lost", "opening", "opening-won", "opening-lost")
    + ("opening-void", "retry", "retry-won", "retry-lost", "grow", "grow-won", "grow-lost")
)
# Arm changes that are not counted as switches (a start, a trial and its return).
_NOT_SWITCHES = frozenset(
    ("start", "probe", "probe-lost", "opening", "opening-lost", "opening-void", "retry")
    + ("retry-lost", "grow", "grow-lost")
)


class PolicyController:
    """Per-request `ModeController`: tracks the span kind and the trial in flight, and dispatches
    each step to the decision it is due for."""

    def __init__(
        self,
        owner: AdaptivePolicy,
        state: ModelState,
        model_id: str,
        request_class: RequestClass,
        *,
        json_output: bool,
        start_in_reasoning: bool,
    ) -> None:
        self.owner = owner
        self.state = state
        self.policy = state.policy
        self.dec = self.policy.decisions
        self.model_id = model_id
        self.label = request_class.label
        self.spans = SpanTracker(json_output=json_output, start_in_reasoning=start_in_reasoning)
        self.reads = StepReads(state.estimates, self.policy, model_id, self.label)
        self.timing_wall = self.policy.estimates.timing == "wall"
        self.arm: Arm = AR
        self.reason = ""
        self.max_block = 16  # the drafter's largest block (0: no drafter)
        self.lookup_block = 0  # the engine's lookup block (0: no lookup)
        self.steps = self.tokens = self.dwell = self.switches = 0
        # Steps run under the current arm since the request's start or the arm's last change
        # (the first `settle_steps` of them are not timed: `measure.observe_step`).
        self.under_arm = 0
        # Rechecks back off while they change nothing (`_recheck_done`, `_reset_rechecks`).
        self._interval = self._next_check = self.dec.recheck_every
        self.trials = RequestTrials(
            self, self.policy, model_id, self.label, state.probes, state.openings, owner.count
        )
        self.decided = DecisionRecords(self.dec.max_recorded, self._publish)
        self._made: ModeDecision | None = None
        self._t_last = 0.0
        # Made by `prepare` for (context, largest block) `_prepared_for`: the start choice per
        # span kind, and the arm each span would open with where the class says AR.
        self._prepared: dict[str, Choice] = {}
        self._opening_if_ar: dict[str, Arm | None] = {}
        self._prepared_for: tuple[int, int, int] | None = None

    # -- ModeController -----------------------------------------------------------------------
    def observe_prefix(self, text: str) -> None:
        """Text committed before `start` (the token the prefill chose), for span tracking."""
        self.spans.push(text)

    def prepare(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> None:
        """Read ahead what the request's first decisions need: the start choice in each span
        kind at this context length, and whether each could open with a trial. The engine calls
        this on another thread while the prefill computes (nothing else touches the estimates
        then), so `start`, and span entries within the first `_PREPARED_STEPS` steps, only
        choose among reads already made. `start` prepares itself when not prepared."""
        self.max_block = default_block_size if default_block_size >= 2 else 0
        self.lookup_block = lookup_block
        self.reads.begin_prepare(prompt_tokens)
        for span in SPAN_KINDS:
            rule = self.policy.rule(self.label, span)
            self._prepared[span] = self.choose(rule, span, None)
            self._opening_if_ar[span] = self.trials.opening_candidate(rule, span, AR)
            self.best_block(span)  # read by the record of a decision for AR
        self.reads.keep_prepared()
        self._prepared_for = (prompt_tokens, default_block_size, lookup_block)

    def start(
        self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0
    ) -> ModeDecision:
        if self._prepared_for != (prompt_tokens, default_block_size, lookup_block):
            self.prepare(prompt_tokens, default_block_size, lookup_block)
        span = self.spans.kind
        arm, reason, kind = self._prepared[span]
        opening = self.trials.allowed_opening(
            span, self._opening_if_ar[span] if arm == AR else None
        )
        self.owner.count("requests", model=self.model_id, **{"class": self.label})
        self._t_last = time.perf_counter()
        if opening is not None:
            return self._set(*self.trials.open(opening, reason, span), span)
        return self._set(arm, reason, kind, span)

    def after_step(self, record: CycleRecord, token_ids: Sequence[int], text: str) -> ModeDecision:
        now = time.perf_counter()
        seconds = step_seconds(record, now, self._t_last, self.timing_wall)
        self._t_last = now
        span = self.spans.kind
        trials = self.trials
        selected = record.mode == "spec" and span == trials.selected
        settling = self.under_arm < self.policy.estimates.settle_steps
        self.under_arm += 1
        self.reads.observe(record, span, seconds, self.arm, selected, settling)
        trials.observe(span, record)
        new_span = self.spans.push(text) if text else span
        self.steps += 1
        self.dwell += 1
        self.tokens += record.committed
        if trials.current is not None:
            verdict, final = trials.step(span, new_span)
            if verdict is not None:
                made = self._set(*verdict, span)
                if final:
                    return made
        if new_span != span:
            return self._enter(new_span)
        if trials.current is None:
            return self._recheck(span)
        return self._decision()

    def finish(self, stats: GenerationStats) -> None:
        self.reads.fresh()
        self.decided.flush()
        self.trials.flush_ticks()
        self.state.estimates.flush_pooled()
        for (span, mode), n in self.reads.steps.items():
            labels = {"model": self.model_id, "class": self.label, "span": span, "mode": mode}
            self.owner.count("steps", n, **labels)
            self.owner.count("tokens", self.reads.tokens[(span, mode)], **labels)
        self.state.dirty = True
        self.owner.save(force=False)
        log.debug(
            "policy.request",
            model=self.model_id,
            request_class=self.label,
            switches=self.switches,
            probes=self.probes,
            probe_steps=self.probe_steps,
            tokens=stats.completion_tokens,
            decode_s=round(stats.decode_s, 4),
        )

    def apply_observations(self) -> None:
        """Add the queued steps to the estimates (a reader of them mid-request calls this)."""
        self.reads.fresh()

    # -- what the response carries --------------------------------------------------------------
    @property
    def probes(self) -> int:
        return self.trials.probes

    @property
    def probe_steps(self) -> int:
        return self.trials.probe_steps

    @property
    def openings(self) -> int:
        return self.trials.openings

    @property
    def records(self) -> list[DecisionRecord]:
        """The decisions made so far (at most `max_recorded`; the gateway serves them)."""
        return self.decided.records

    @property
    def decisions(self) -> list[dict[str, Any]]:
        """The decisions made so far (at most `max_recorded`), as the summary lists them."""
        return [r.entry() for r in self.records]

    def summary(self) -> dict[str, Any]:
        """JSON-able account of this request's policy."""
        return {
            "policy": "adaptive",
            "class": self.label,
            "span": self.spans.kind,
            "switches": self.switches,
            "probes": self.probes,
            "probe_steps": self.probe_steps,
            "openings": self.openings,
            "decisions": self.decisions,
            "decisions_dropped": self.decided.dropped,
        }

    # -- dispatch -------------------------------------------------------------------------------
    def _enter(self, span: str) -> ModeDecision:
        """A new span kind: its arm and block chosen afresh, opened with a trial cycle where the
        class says AR (a tool call that copies names and paths from its context accepts whole
        blocks where the class's other tool calls accept little)."""
        trials = self.trials
        self._reset_rechecks()
        trials.selected = None
        early = self.steps <= _PREPARED_STEPS
        if early:
            self.reads.use_prepared()
        rule = self.policy.rule(self.label, span)
        arm, reason, kind = self.choose(rule, span, self.arm, fresh_block=True)
        if trials.overruled(arm, span):
            arm, reason = AR, f"{span}: this request's own acceptance chose ar here"
        if early:
            candidate = self._opening_if_ar[span] if arm == AR else None
        else:
            candidate = trials.opening_candidate(rule, span, arm)
        opening = trials.allowed_opening(span, candidate)
        if opening is not None and span not in trials.own_ar:
            return self._set(*trials.open(opening, reason, span), span)
        return self._set(arm, reason, kind, span)

    def _recheck(self, span: str) -> ModeDecision:
        """Inside a span with no trial in flight: a retry where one is due; once the arm has
        settled (`min_dwell` steps), at each recheck: this request's own verdict where it has
        one, then whether a known arm beats the current one outright, only then whether to
        probe (probing while a measured arm is clearly faster would only delay the switch)."""
        trials = self.trials
        rule = self.policy.rule(self.label, span)
        retry = trials.retry(span)
        if retry is not None:
            return self._set(*retry, span)
        grow = trials.grow(rule, span)
        if grow is not None:
            return self._set(*grow, span)
        min_dwell = self.dec.min_dwell
        due = self.steps >= self._next_check or self.dwell == min_dwell
        if due and self.dwell >= min_dwell:
            own = trials.recheck(rule, span)
            if own is True:  # this request's own cycles keep the arm
                self._recheck_done()
                return self._decision()
            if own:
                return self._set(*own, span)
            arm, reason, _ = self.choose(rule, span, self.arm)
            if arm != self.arm and not trials.overruled(arm, span):
                return self._set(arm, reason, "recheck", span)
        # Where this request's own acceptance chose AR (a lost opening, a request verdict),
        # spec probes would only read again what it already said.
        if due and trials.budget > 0 and rule.mode != "ar" and span not in trials.read_ar:
            probe = trials.probe(rule, span)
            if probe is not None:
                self._set(*probe, span)
        if due and trials.current is None:
            self._recheck_done()
        return self._decision()

    # -- reads, decisions, records ----------------------------------------------------------------
    def choose(
        self, rule: SpanRule, span: str, current: Arm | None, fresh_block: bool = False
    ) -> Choice:
        """`decide.choose` over this step's reads of the rule's arms."""
        allowed = self.arms(rule)
        est = {a: self.reads.throughput(a, span) for a in allowed}
        return decide.choose(
            rule,
            span,
            current,
            allowed,
            est,
            running=self.arm,
            initial_mode=self.dec.initial_mode,
            fresh_block=fresh_block,
            caution=self.dec.start_caution if current is None else 0.0,
            block_precedence=self.dec.block_precedence,
        )

    def arms(self, rule: SpanRule) -> list[Arm]:
        """The arms `rule` allows on this engine."""
        return decide.arms(rule, self.max_block, self.lookup_block)

    def best_block(self, span: str) -> int:
        rule = self.policy.rule(self.label, span)
        allowed = self.arms(rule)
        spec = {a: self.reads.throughput(a, span) for a in allowed if a[0] == "spec"}
        return decide.best_block(rule, allowed, spec, self.dec.block_precedence)

    def _set(self, arm: Arm, reason: str, kind: str, span: str) -> ModeDecision:
        changed = arm != self.arm
        if changed:
            self.under_arm = 0
            self.trials.whole = 0
        if changed and kind not in _NOT_SWITCHES:
            self.switches += 1
        if changed or kind in _RECORDED_KINDS:
            self.dwell = 0
            self._reset_rechecks()
            block = arm[1] if arm[0] == "spec" else self.best_block(span)
            spec, tau = self.reads.estimate(("spec", block), span)
            surplus = Surplus(spec, self.reads.throughput(AR, span), tau, block)
            arm_block = arm[1] if arm[0] != "ar" else None
            # Only the record is made here; its log line and counter come at finish (`_publish`).
            self.decided.add(
                DecisionRecord(
                    self.steps, arm[0], arm_block, reason, span, kind, self.tokens, surplus
                )
            )
        self.arm = arm
        self.reason = reason
        return self._decision()

    def _publish(self, rec: DecisionRecord) -> None:
        """A decision record's `decisions` counter and `policy.decision` log line."""
        self.owner.count(
            "decisions",
            model=self.model_id,
            span=rec.span or "",
            mode=rec.mode,
            kind=rec.kind or "",
            **{"class": self.label},
        )
        entry = rec.entry()
        del entry["block_size"], entry["mode"]
        log.info(
            "policy.decision",
            model=self.model_id,
            request_class=self.label,
            **entry,
            mode=rec.arm_name,
        )

    def _decision(self) -> ModeDecision:
        mode, block = self.arm
        made = self._made
        size = block if mode != "ar" else self.max_block
        if (
            made is None
            or made.mode != mode
            or made.block_size != size
            or made.reason != self.reason
        ):
            made = self._made = ModeDecision(mode, size, self.reason)
        return made

    def _recheck_done(self) -> None:
        """A recheck that kept the arm and started no probe: the next one comes twice as late (up
        to `recheck_max` steps). Where the choice is clear, rechecking every few steps costs
        more than it can find (a recheck is ~10 estimate reads; an AR step of a small model is a
        few ms); any decision resets the interval (`_set`)."""
        if self.dwell >= self.dec.min_dwell:
            most = max(self.dec.recheck_max, self.dec.recheck_every)
            self._interval = min(self._interval * 2, most)
        self._next_check = self.steps + self._interval

    def _reset_rechecks(self) -> None:
        """A decision or a new span: recheck at the base interval again."""
        self._interval = self.dec.recheck_every
        self._next_check = self.steps + self._interval
