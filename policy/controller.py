"""The adaptive decoding policy: one process-wide `AdaptivePolicy`, one `PolicyController` per request.

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
- trials (`trial.py`): a probe of another arm where an estimate is uncertain; where the class
  says AR, an opening spec cycle at the request's start and at each span it enters, kept when
  this request's own acceptance beats AR (`request_evidence.py`); and, where this request's own
  cycles moved a span to AR (`request_evidence_cycles`, off by default), retry cycles.
The decisions themselves are pure functions (`decide.py`); the estimate reads and queued
measurements are `StepReads` (`reads.py`); this module tracks spans and trials and dispatches.
The block decided here is the largest a cycle drafts: the engine's adaptive draft length
(`engine/draft_length.py`) shortens it after rejected drafts inside a spec stretch. Every
decision is a `DecisionRecord` (`record.py`): listed (`records`), logged and counted at `finish`,
which the engine calls after the response's last event.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from toolflash.engine.api import CycleRecord, GenerationStats, ModeDecision
from toolflash.policy.request_class import RequestClass

from . import decide
from .config import EffectivePolicy, PolicyConfig, SpanRule
from .decide import AR, Arm, Choice, arm_name
from .estimates import Clock, Estimates, Surplus
from .measure import step_seconds
from .reads import StepReads
from .record import DecisionRecord, DecisionRecords
from .request_evidence import RequestEvidence
from .spans import SPAN_KINDS, SpanTracker
from .store import PolicyStore
from .trial import Backoff, Trial, opening_backoff, probe_backoff, retry_backoff

log = structlog.get_logger(__name__)

# Span entries within a request's first steps choose from the reads `prepare` made.
_PREPARED_STEPS = 8
# Decisions recorded (and dwell reset) even when they keep the arm.
_RECORDED_KINDS = frozenset(
    ("start", "probe", "probe-won", "probe-lost", "opening", "opening-won", "opening-lost")
    + ("opening-void", "retry", "retry-won", "retry-lost")
)
# Arm changes that are not counted as switches (a start, a trial and its return).
_NOT_SWITCHES = frozenset(
    ("start", "probe", "probe-lost", "opening", "opening-lost", "opening-void", "retry")
    + ("retry-lost",)
)


@dataclass
class ModelState:
    """Everything the policy keeps for one served model: the learned estimates and the
    process-wide backoffs of probes and openings."""

    policy: EffectivePolicy
    estimates: Estimates
    probes: Backoff
    openings: Backoff
    store: PolicyStore | None
    last_save: float = 0.0
    dirty: bool = False


class AdaptivePolicy:
    """Process-wide: configuration, learned estimates, trial backoffs and counters. Build once per
    server; `controller_for` makes the per-request controller the engine drives."""

    def __init__(
        self,
        config: PolicyConfig | None = None,
        *,
        clock: Clock = time.time,
        persist: bool = True,
        state_file: str | None = None,
    ) -> None:
        self.config = config or PolicyConfig()
        self.clock = clock
        self.persist = persist
        self.state_file = state_file
        self._models: dict[str, ModelState] = {}
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def model(self, model_id: str) -> ModelState:
        """The state for a model, created (and loaded from the state file) on first use."""
        state = self._models.get(model_id)
        if state is not None:
            return state
        policy = self.config.for_model(model_id)
        est = policy.estimates
        estimates = Estimates(
            sample_half_life=est.sample_half_life,
            half_life_s=est.half_life_s,
            smallest_bucket=est.smallest_bucket,
            clock=self.clock,
        )
        store = None
        if self.persist:
            store = PolicyStore(self.state_file or policy.state_file())
            store.load(model_id, estimates)
        ex = policy.exploration
        probes = probe_backoff(ex.backoff_base_steps, ex.backoff_max_steps)
        state = ModelState(policy, estimates, probes, opening_backoff(), store)
        state.last_save = self.clock()
        self._models[model_id] = state
        return state

    def controller_for(
        self,
        model_id: str,
        request_class: RequestClass,
        response_format_json: bool,
        *,
        start_in_reasoning: bool = False,
    ) -> PolicyController:
        """A fresh controller for one request of `model_id`."""
        return PolicyController(
            self,
            self.model(model_id),
            model_id,
            request_class,
            json_output=response_format_json,
            start_in_reasoning=start_in_reasoning,
        )

    def count(self, name: str, value: int = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counts[key] += value

    def counters(self) -> dict[str, list[dict[str, Any]]]:
        """Snapshot: counter name -> rows of {"labels": {...}, "value": n} (Prometheus-ready).
        Names: `decisions` (model, class, span, mode, kind), `steps` and `tokens` (model, class,
        span, mode), `probes` and `openings` (model, class, span, [arm,] outcome), `requests`
        (model, class)."""
        with self._lock:
            items = list(self._counts.items())
        out: dict[str, list[dict[str, Any]]] = {}
        for (name, labels), value in sorted(items):
            out.setdefault(name, []).append({"labels": dict(labels), "value": value})
        return out

    def save(self, force: bool = True) -> None:
        """Write learned estimates of every model (throttled unless `force`)."""
        now = self.clock()
        for model_id, state in list(self._models.items()):
            if state.store is None or not state.dirty:
                continue
            if not force and now - state.last_save < state.policy.data.save_every_s:
                continue
            if state.store.save(model_id, state.estimates):
                state.dirty = False
            state.last_save = now


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
        self.explore = self.policy.exploration
        self.model_id = model_id
        self.label = request_class.label
        self.spans = SpanTracker(json_output=json_output, start_in_reasoning=start_in_reasoning)
        self.reads = StepReads(state.estimates, self.policy, model_id, self.label)
        self.timing_wall = self.policy.estimates.timing == "wall"
        self.arm: Arm = AR
        self.reason = ""
        self.max_block = 16
        self.steps = self.tokens = self.dwell = 0
        self.switches = self.probes = self.probe_steps = self.openings = 0
        self.budget = self.explore.budget_per_request
        # Rechecks back off while they change nothing (`_recheck_done`, `_reset_rechecks`).
        self._interval = self._next_check = self.dec.recheck_every
        self.trial: Trial | None = None
        # This request's own acceptance per span, and what it decided: spans it moved to AR
        # (`_own_ar`: the class estimates do not switch them back, retry cycles may), spans
        # where its own cycles said AR (`_read_ar`: no spec probes there), and the span running
        # spec because its own acceptance won (`_selected`: its cycles are no measure of the
        # class, which would otherwise learn from the requests that won alone).
        self.evidence = RequestEvidence(self.dec.request_evidence_cycles)
        self.retries = retry_backoff(lambda: self.steps)
        self._own_ar: set[str] = set()
        self._read_ar: set[str] = set()
        self._selected: str | None = None
        self.decided = DecisionRecords(self.dec.max_recorded, self._publish)
        self._made: ModeDecision | None = None
        self._t_last = 0.0
        # Made by `prepare` for (context, largest block) `_prepared_for`: the start choice per
        # span kind, and the arm each span would open with where the class says AR.
        self._prepared: dict[str, Choice] = {}
        self._opening_if_ar: dict[str, Arm | None] = {}
        self._prepared_for: tuple[int, int] | None = None

    # -- ModeController -----------------------------------------------------------------------
    def observe_prefix(self, text: str) -> None:
        """Text committed before `start` (the token the prefill chose), for span tracking."""
        self.spans.push(text)

    def prepare(self, prompt_tokens: int, default_block_size: int) -> None:
        """Read ahead what the request's first decisions need: the start choice in each span
        kind at this context length, and whether each could open with a trial. The engine calls
        this on another thread while the prefill computes (nothing else touches the estimates
        then), so `start`, and span entries within the first `_PREPARED_STEPS` steps, only
        choose among reads already made. `start` prepares itself when not prepared."""
        self.max_block = max(default_block_size, 2)
        self.reads.begin_prepare(prompt_tokens)
        for span in SPAN_KINDS:
            rule = self.policy.rule(self.label, span)
            self._prepared[span] = self._choose(rule, span, None)
            self._opening_if_ar[span] = self._opening_candidate(rule, span, AR)
            self._best_block(span)  # read by the record of a decision for AR
        self.reads.keep_prepared()
        self._prepared_for = (prompt_tokens, self.max_block)

    def start(self, prompt_tokens: int, default_block_size: int) -> ModeDecision:
        if self._prepared_for != (prompt_tokens, max(default_block_size, 2)):
            self.prepare(prompt_tokens, default_block_size)
        span = self.spans.kind
        arm, reason, kind = self._prepared[span]
        opening = self._allowed_opening(span, self._opening_if_ar[span] if arm == AR else None)
        self.owner.count("requests", model=self.model_id, **{"class": self.label})
        self._t_last = time.perf_counter()
        if opening is not None:
            return self._open(opening, reason, span)
        return self._set(arm, kind, reason, span)

    def after_step(self, record: CycleRecord, token_ids: Sequence[int], text: str) -> ModeDecision:
        now = time.perf_counter()
        seconds = step_seconds(record, now, self._t_last, self.timing_wall)
        self._t_last = now
        span = self.spans.kind
        selected = record.mode == "spec" and span == self._selected
        self.reads.observe(record, span, seconds, self.arm, selected)
        self.evidence.add(span, record)
        new_span = self.spans.push(text) if text else span
        self.steps += 1
        self.dwell += 1
        self.tokens += record.committed
        if self.trial is not None:
            judged = self._trial_step(self.trial, span, new_span)
            if judged is not None:
                return judged
        if new_span != span:
            return self._enter(new_span)
        if self.trial is None:
            return self._recheck(span)
        return self._decision()

    def finish(self, stats: GenerationStats) -> None:
        self.reads.fresh()
        self.decided.flush()
        self._flush_ticks()
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
        self._reset_rechecks()
        self._selected = None
        early = self.steps <= _PREPARED_STEPS
        if early:
            self.reads.use_prepared()
        rule = self.policy.rule(self.label, span)
        arm, reason, kind = self._choose(rule, span, self.arm, fresh_block=True)
        if self._overruled(arm, span):
            arm, reason = AR, f"{span}: this request's own acceptance chose ar here"
        if early:
            candidate = self._opening_if_ar[span] if arm == AR else None
        else:
            candidate = self._opening_candidate(rule, span, arm)
        opening = self._allowed_opening(span, candidate)
        if opening is not None and span not in self._own_ar:
            return self._open(opening, reason, span)
        return self._set(arm, kind, reason, span)

    def _recheck(self, span: str) -> ModeDecision:
        """Inside a span with no trial in flight: a retry where one is due; once the arm has
        settled (`min_dwell` steps), at each recheck: this request's own verdict where it has
        one, then whether a known arm beats the current one outright, only then whether to
        probe (probing while a measured arm is clearly faster would only delay the switch)."""
        rule = self.policy.rule(self.label, span)
        if self.arm == AR and span in self._own_ar and self.retries.allowed(span):
            block = self._best_block(span)
            self.trial = Trial("retry", span, ("spec", block), AR, 1)
            why = f"{span}: one spec{block} cycle after {self.retries.waited(span)} ar steps"
            return self._set(("spec", block), "retry", why, span)
        min_dwell = self.dec.min_dwell
        due = self.steps >= self._next_check or self.dwell == min_dwell
        if due and self.dwell >= min_dwell:
            # A span that runs spec on this request's own acceptance stays on it: the class
            # (which chose AR here) does not rule it, its recent cycles do.
            selected = span == self._selected
            own = self._request_verdict(
                rule, span, self.evidence.tau(span, min_cycles=1 if selected else None)
            )
            if own is not None:
                verdict, why = own
                if verdict == "ar":
                    self._selected = None
                    self._read_ar.add(span)
                    self._own_ar.add(span)
                    self.retries.lost(span)
                    return self._set(AR, "request", why, span)
                if verdict == "spec" or selected:  # the class mean does not rule
                    self._recheck_done()
                    return self._decision()
            arm, reason, _ = self._choose(rule, span, self.arm)
            if arm != self.arm and not self._overruled(arm, span):
                return self._set(arm, "recheck", reason, span)
        # Where this request's own acceptance chose AR (a lost opening, a request verdict),
        # spec probes would only read again what it already said.
        if due and self.budget > 0 and rule.mode != "ar" and span not in self._read_ar:
            self._maybe_probe(rule, span)
        if due and self.trial is None:
            self._recheck_done()
        return self._decision()

    # -- trials ---------------------------------------------------------------------------------
    def _trial_step(self, trial: Trial, span: str, new_span: str) -> ModeDecision | None:
        """Count a step of the trial; at its end, its verdict (a probe's is made and the step
        decides on; an opening's or retry's is the step's decision, unless the span changed)."""
        trial.remaining -= 1
        if trial.kind == "probe":
            self.probe_steps += 1
            self.budget -= 1
        if trial.remaining > 0 and new_span == span:
            return None
        self.trial = None
        if trial.kind == "probe":
            self._end_probe(trial, span)
            return None
        if not new_span == span == trial.span:
            return None
        if trial.kind == "opening":
            return self._end_opening(span)
        return self._end_retry(span)

    def _maybe_probe(self, rule: SpanRule, span: str) -> None:
        if self.dwell < self.dec.min_dwell:
            return
        self.reads.fresh()
        self._flush_ticks()
        scope = (self.model_id, self.label, span)
        allowed = decide.arms(rule, self.max_block)
        est = {a: self.reads.throughput(a, span) for a in allowed}
        cur = self.reads.throughput(self.arm, span)
        # A probe is worth it only if the arm could beat the best arm known here (not merely
        # the current one, which may itself be about to lose).
        known = [t for t in est.values() if t.known]
        top = max([cur, *known], key=lambda t: t.tps if t.known else -1.0)
        largest = max((a[1] for a in allowed if a[0] == "spec"), default=0)
        candidates = [
            arm
            for arm in allowed
            if arm != self.arm
            and self.state.probes.allowed(scope, arm)
            # Tau is unknown here for every block alike; a probe at the largest block measures
            # it for all of them (smaller blocks are credited from its cycles).
            and not (
                arm[0] == "spec"
                and arm[1] != largest
                and self.reads.measured_tau(span, arm[1]) is None
            )
            and not (
                arm[0] == "spec"
                and self.explore.skip_hopeless
                and not decide.could_win(self.reads.spec_bound(arm[1], span), top, rule)
            )
        ]
        picked = decide.pick_probe(candidates, est, cur, rule, self.explore.explore_p)
        if picked is None:
            return
        arm, why = picked
        length = self.explore.probe_ar_steps if arm == AR else self.explore.probe_spec_cycles
        length = min(length, self.budget)
        self.trial = Trial("probe", span, arm, self.arm, length)
        self.probes += 1
        self._set(arm, "probe", f"{span}: probe {arm_name(arm)} for {length} steps ({why})", span)

    def _end_probe(self, probe: Trial, span: str) -> None:
        self._flush_ticks()
        scope = (self.model_id, self.label, span)
        rule = self.policy.rule(self.label, span)
        est = {probe.arm: self.reads.throughput(probe.arm, span)}
        est[probe.base] = self.reads.throughput(probe.base, span)
        won = decide.beats(est[probe.arm], est[probe.base], rule)
        self.owner.count(
            "probes",
            model=self.model_id,
            outcome="won" if won else "lost",
            arm=arm_name(probe.arm),
            span=span,
            **{"class": self.label},
        )
        vs = f"{decide.fmt(probe.arm, est)} vs {decide.fmt(probe.base, est)}"
        if won:
            self.state.probes.won(scope, probe.arm)
            self._set(probe.arm, "probe-won", f"{span}: probe won, {vs}", span)
            return
        wait = self.state.probes.lost(scope, probe.arm)
        p = decide.p_better(est[probe.arm], est[probe.base])
        reason = f"{span}: probe lost, {vs} (p={p:.2f}); next probe in {wait} steps"
        # Back to the base, unless what is known now says another arm beats it outright.
        arm, why, _ = self._choose(rule, span, probe.base)
        if arm != probe.base:
            reason = f"{reason}; {why}"
        self._set(arm, "probe-lost", reason, span)

    def _opening_candidate(self, rule: SpanRule, span: str, arm: Arm) -> Arm | None:
        """The spec arm to open `span` with, where the class chose AR and an opening is on and
        judgeable (AR and the cycle time measured; no grammar-forced runs, which one drafted
        cycle cannot judge). The backoff is asked apart (`_allowed_opening`): a read must not
        consume its chances."""
        if not self.explore.opening_probe or arm != AR or rule.mode != "adaptive":
            return None
        self.reads.fresh()
        spec = [a for a in decide.arms(rule, self.max_block) if a[0] == "spec"]
        if not spec:
            return None
        largest = max(spec, key=lambda a: a[1])
        if not self.reads.throughput(AR, span).known or self.reads.has_forced_runs(span):
            return None
        if self.reads.cycle_seconds(largest[1]) is None:
            return None
        return largest

    def _allowed_opening(self, span: str, candidate: Arm | None) -> Arm | None:
        """`candidate` where the opening backoff allows it (asking is one chance)."""
        if candidate is None or not self.state.openings.ask((self.model_id, self.label, span)):
            return None
        return candidate

    def _open(self, arm: Arm, reason: str, span: str) -> ModeDecision:
        """Start an opening trial of `span`: one `arm` cycle, judged at the next step."""
        self.trial = Trial("opening", span, arm, AR, 1)
        self.openings += 1
        reason = f"{reason}; opening probe: one {arm_name(arm)} cycle reads this request"
        return self._set(arm, "opening", reason, span)

    def _end_opening(self, span: str) -> ModeDecision:
        """Stay speculative when the opening cycle beat AR, else back to AR (the class's choice);
        no verdict (nor backoff) when it met a forced run: the class's estimates choose."""
        scope = (self.model_id, self.label, span)
        rule = self.policy.rule(self.label, span)
        own = self._request_verdict(rule, span, self.evidence.tau(span, min_cycles=1))
        if own is None:
            arm, why, _ = self._choose(rule, span, None)
            return self._set(arm, "opening-void", f"{why} (opening probe not judgeable)", span)
        won = own[0] == "spec"
        self.owner.count(
            "openings",
            model=self.model_id,
            outcome="won" if won else "lost",
            span=span,
            **{"class": self.label},
        )
        if won:
            self.state.openings.won(scope)
            self._selected = span
            self._read_ar.discard(span)
            return self._set(self.arm, "opening-won", own[1], span)
        wait = self.state.openings.lost(scope)
        self._read_ar.add(span)
        return self._set(AR, "opening-lost", f"{own[1]}; the next {wait} openings skipped", span)

    def _end_retry(self, span: str) -> ModeDecision:
        """This request's tokens per cycle over the window, the retry included, against AR. Won:
        spec again, and the class estimates rule the span once more; lost: AR, retried twice as
        late."""
        rule = self.policy.rule(self.label, span)
        own = self._request_verdict(rule, span, self.evidence.tau(span, min_cycles=1))
        if own is not None and own[0] == "spec":
            self._own_ar.discard(span)
            self.retries.won(span)
            self._selected = span
            return self._set(self.arm, "retry-won", own[1], span)
        self.retries.lost(span)
        why = own[1] if own is not None else f"{span}: retry not judgeable"
        return self._set(AR, "retry-lost", why, span)

    def _request_verdict(
        self, rule: SpanRule, span: str, tau: float | None
    ) -> tuple[str, str] | None:
        """(verdict, reason) from this request's own tokens per cycle at the current block, or
        None when there is not enough of it (or AR is not an option here)."""
        if tau is None or rule.mode != "adaptive" or self.arm[0] != "spec":
            return None
        cycle_s = self.reads.cycle_seconds(self.arm[1])
        ar = self.reads.throughput(AR, span)
        if cycle_s is None or not ar.known:
            return None
        verdict = decide.local_verdict(tau, cycle_s, ar.tps, rule.switch_margin)
        why = (
            f"{span}: this request's {arm_name(self.arm)} {tau / cycle_s:.0f} tok/s "
            f"(tau {tau:.2f}, {self.evidence.cycles(span)} cycles) vs ar {ar.tps:.0f} tok/s"
        )
        return verdict, why

    def _overruled(self, arm: Arm, span: str) -> bool:
        """Whether the class's choice of `arm` yields to this request's own evidence: a spec arm
        in a span where the request's acceptance already chose AR (`_own_ar` only holds
        adaptive spans, so AR is an option there)."""
        return arm[0] == "spec" and span in self._own_ar

    # -- reads, decisions, records ----------------------------------------------------------------
    def _choose(
        self, rule: SpanRule, span: str, current: Arm | None, fresh_block: bool = False
    ) -> Choice:
        """`decide.choose` over this step's reads of the rule's arms."""
        allowed = decide.arms(rule, self.max_block)
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
        )

    def _best_block(self, span: str) -> int:
        rule = self.policy.rule(self.label, span)
        allowed = decide.arms(rule, self.max_block)
        spec = {a: self.reads.throughput(a, span) for a in allowed if a[0] == "spec"}
        return decide.best_block(rule, allowed, spec)

    def _set(self, arm: Arm, kind: str, reason: str, span: str) -> ModeDecision:
        changed = arm != self.arm
        if changed and kind not in _NOT_SWITCHES:
            self.switches += 1
        if changed or kind in _RECORDED_KINDS:
            self.dwell = 0
            self._reset_rechecks()
            block = arm[1] if arm[0] == "spec" else self._best_block(span)
            spec, tau = self.reads.estimate(("spec", block), span)
            surplus = Surplus(spec, self.reads.throughput(AR, span), tau, block)
            spec_block = arm[1] if arm[0] == "spec" else None
            # Only the record is made here; its log line and counter come at finish (`_publish`).
            self.decided.add(
                DecisionRecord(
                    self.steps, arm[0], spec_block, reason, span, kind, self.tokens, surplus
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
        size = block if mode == "spec" else self.max_block
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

    def _flush_ticks(self) -> None:
        """Add the steps counted since the last flush to the process-wide probe backoff's clock
        (kept per request between decisions so the per-step path stays small)."""
        for span, n in self.reads.take_ticks().items():
            self.state.probes.tick((self.model_id, self.label, span), n)
