"""The adaptive decoding policy: one process-wide `AdaptivePolicy`, one `PolicyController` per request.

The engine calls the controller between cycles (`engine.api.ModeController`). Each step feeds the
estimates (spec cycle: tokens per cycle and seconds per cycle; AR step: seconds per token), moves
the span tracker over the committed text, and decides the next mode and block size:
- at request start, and whenever the span kind changes, the best-known arm for the new span
  (AR, or spec at one of the configured block sizes) is chosen; entering a tool call thus goes to
  AR when the tool-call surplus is negative, and leaving it returns to spec when text pays;
- inside a span the choice is rechecked every `recheck_every` steps;
- hysteresis: leaving the current arm needs the other to be faster by `switch_margin` with
  confidence `min_confidence`, and (inside a span) `min_dwell` steps in the current arm;
- where an estimate is uncertain, a short probe of the other arm (see `explore.py`).
- the request's own acceptance (`request_evidence.py`): where the class says AR, an opening
  probe of one spec cycle (at the request's start and at each span it enters) keeps spec for
  a request that beats AR; and, when
  `request_evidence_cycles` is set (off by default), once a span has that many drafted cycles
  of its own, its tokens per cycle decide spec vs AR at rechecks.
The block decided here is the largest a cycle drafts: the engine's adaptive draft length
(`engine/draft_length.py`) shortens it after rejected drafts inside a spec stretch.
Every decision is logged, counted (`AdaptivePolicy.counters()`) and listed (`decisions`).

What runs between decode steps is kept small, since a short agent turn decodes in a few
cycles of a few ms each: the estimate reads for the start (and for span entries in the first
steps) are made by `prepare` while the prefill computes; a step's measurement is queued and
added to the estimates before the next fresh read or at `finish`; a decision is recorded as
made and turned into its entry, log line and counter at `finish`, which the engine calls after
the response's last event.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from toolflash.engine.api import CycleRecord, GenerationStats, ModeDecision
from toolflash.policy.request_class import RequestClass

from .config import EffectivePolicy, PolicyConfig, SpanRule
from .estimates import UNKNOWN, Clock, Estimates, Surplus, Throughput
from .explore import Arm, Backoff, Probe, arm_name, p_better, probe_reason
from .measure import observe_step, step_seconds
from .request_evidence import OpeningBackoff, RequestEvidence, local_verdict
from .spans import SPAN_KINDS, SpanTracker
from .store import PolicyStore

log = structlog.get_logger(__name__)

AR: Arm = ("ar", 1)
# AR steps before a span that this request moved to AR retries one spec cycle; the wait
# doubles after each lost retry, up to the maximum.
_RETRY_FIRST = 16
_RETRY_MAX = 256
# Span entries within a request's first steps choose from the reads `prepare` made.
_PREPARED_STEPS = 8


@dataclass
class _ModelState:
    """Everything the policy keeps for one served model."""

    policy: EffectivePolicy
    estimates: Estimates
    backoff: Backoff
    store: PolicyStore | None
    opening: OpeningBackoff = field(default_factory=OpeningBackoff)
    last_save: float = 0.0
    dirty: bool = False


class AdaptivePolicy:
    """Process-wide: configuration, learned estimates, probe backoff and counters. Build once per
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
        self._models: dict[str, _ModelState] = {}
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def model(self, model_id: str) -> _ModelState:
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
        state = _ModelState(
            policy, estimates, Backoff(ex.backoff_base_steps, ex.backoff_max_steps), store
        )
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

    # -- counters -----------------------------------------------------------------------------
    def count(self, name: str, value: int = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counts[key] += value

    def counters(self) -> dict[str, list[dict[str, Any]]]:
        """Snapshot: counter name -> rows of {"labels": {...}, "value": n} (Prometheus-ready).
        Names: `decisions` (model, class, span, mode, kind), `steps` and `tokens` (model, class,
        span, mode), `probes` (model, class, span, arm, outcome), `requests` (model, class)."""
        with self._lock:
            items = list(self._counts.items())
        out: dict[str, list[dict[str, Any]]] = {}
        for (name, labels), value in sorted(items):
            out.setdefault(name, []).append({"labels": dict(labels), "value": value})
        return out

    # -- persistence --------------------------------------------------------------------------
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


# Decision records queued before they are published (`PolicyController._publish`).
_PUBLISH_EVERY = 32


@dataclass(frozen=True)
class _Record:
    """A decision as made: published (entry, log line, counter) after the decode steps."""

    step: int
    tokens: int
    span: str
    arm: Arm
    kind: str
    reason: str
    surplus: Surplus


# Decisions recorded (and dwell reset) even when they keep the arm.
_RECORDED_KINDS = (
    "start",
    "probe",
    "probe-won",
    "probe-lost",
    "opening",
    "opening-won",
    "opening-lost",
    "opening-void",
    "retry",
    "retry-won",
    "retry-lost",
)
# Arm changes that are not counted as switches (a start, a probe or retry and its return).
_NOT_SWITCHES = (
    "start",
    "probe",
    "probe-lost",
    "opening",
    "opening-lost",
    "opening-void",
    "retry",
    "retry-lost",
)


class PolicyController:
    """Per-request `ModeController`: tracks the span kind, feeds the estimates, decides."""

    def __init__(
        self,
        owner: AdaptivePolicy,
        state: _ModelState,
        model_id: str,
        request_class: RequestClass,
        *,
        json_output: bool,
        start_in_reasoning: bool,
    ) -> None:
        self.owner = owner
        self.state = state
        self.policy = state.policy
        self.est = state.estimates
        self.model_id = model_id
        self.request_class = request_class
        self.label = request_class.label
        self.spans = SpanTracker(json_output=json_output, start_in_reasoning=start_in_reasoning)
        dec = self.policy.decisions
        self.recheck_every = dec.recheck_every
        self.recheck_max = max(dec.recheck_max, dec.recheck_every)
        # Rechecks back off while they change nothing (`_recheck_done`, `_reset_rechecks`).
        self._interval = self.recheck_every
        self._next_check = self.recheck_every
        self.min_dwell = dec.min_dwell
        self.max_recorded = dec.max_recorded
        ex = self.policy.exploration
        self.explore = ex
        self.budget = ex.budget_per_request
        self.timing_wall = self.policy.estimates.timing == "wall"
        self._entries: list[dict[str, Any]] = []
        self._pending: list[_Record] = []
        self.dropped = 0
        self.arm: Arm = AR
        self.max_block = 16
        self.context = 0
        self.steps = 0
        self.tokens = 0
        self.dwell = 0
        self.switches = 0
        self.probes = 0
        self.probe_steps = 0
        self.probe: Probe | None = None
        # This request's own acceptance per span (`request_evidence.py`), and the span whose
        # opening probe (one spec cycle where the class says AR) awaits its verdict.
        self.evidence = RequestEvidence(dec.request_evidence_cycles)
        self._opening: str | None = None
        self.openings = 0
        # Spans where this request's own acceptance chose AR: the class estimates (which may
        # favour spec) do not switch them back within this request (no flapping).
        self._own_ar: set[str] = set()
        # ... but the request's acceptance can recover (an explanation that starts slowly and
        # then flows): after `_RETRY_FIRST` AR steps one spec cycle retries, doubling the wait
        # after each lost retry. `_retry` is the span whose retry cycle awaits its verdict.
        self._own_ar_at: dict[str, int] = {}
        self._own_ar_wait: dict[str, int] = {}
        self._retry: str | None = None
        # The span whose spec cycles run because this request's own acceptance won (an
        # opening or a retry): they do not feed the class's spec estimate, which would
        # otherwise learn from the requests that won alone and send the others to spec.
        self._selected: str | None = None
        # Spans where this request's own cycles said AR (`_own_ar`, or a lost opening).
        self._read_ar: set[str] = set()
        self.reason = ""
        self._t_last = 0.0
        self._steps: dict[tuple[str, str], int] = {}
        self._ticks: dict[str, int] = {}  # steps per span not yet added to the backoff clock
        self._made: ModeDecision | None = None
        self._tokens: dict[tuple[str, str], int] = {}
        # Throughputs computed at this step (a recheck asks for the same arms several times).
        self._tp: dict[tuple[Arm, str], tuple[Throughput, float]] = {}
        self._tp_step = -1
        # Made ahead by `prepare`, for (context, largest block) `_prepared_for`: the start
        # choice per span kind (arm, reason, kind), the arm each span would open with where
        # the class says AR, and the estimate reads behind them.
        self._prepared: dict[str, tuple[Arm, str, str]] = {}
        self._opening_if_ar: dict[str, Arm | None] = {}
        self._prepared_reads: dict[tuple[Arm, str], tuple[Throughput, float]] = {}
        self._prepared_for: tuple[int, int] | None = None
        # Steps not yet added to the estimates (`_observe`, `apply_observations`): (record,
        # span, seconds, the arm it ran under, selected by this request's own acceptance).
        self._unapplied: list[tuple[CycleRecord, str, float, Arm, bool]] = []

    # -- ModeController -----------------------------------------------------------------------
    def observe_prefix(self, text: str) -> None:
        """Text committed before `start` (the token the prefill chose), for span tracking."""
        self.spans.push(text)

    def prepare(self, prompt_tokens: int, default_block_size: int) -> None:
        """Read the estimates the request's first decisions need, ahead: every arm of every
        span kind at this context length, the start choice in each span kind, and whether
        each could open with a probe. The engine calls this on another thread while the
        prefill computes (nothing else touches the estimates then), so `start`, and span
        entries within the first `_PREPARED_STEPS` steps (a short agent turn's tool call),
        only choose among reads already made. `start` prepares itself when not prepared."""
        self.max_block = max(default_block_size, 2)
        self.context = prompt_tokens
        self._tp.clear()
        self._tp_step = self.steps
        for span in SPAN_KINDS:
            rule = self.policy.rule(self.label, span)
            self._prepared[span] = self._choose(rule, span, None)
            self._opening_if_ar[span] = self._opening_candidate(rule, span, AR)
            self._best_block(span)  # read by the record of a decision for AR
        self._prepared_reads = dict(self._tp)
        self._prepared_for = (prompt_tokens, self.max_block)

    def start(self, prompt_tokens: int, default_block_size: int) -> ModeDecision:
        if self._prepared_for != (prompt_tokens, max(default_block_size, 2)):
            self.prepare(prompt_tokens, default_block_size)
        span = self.spans.kind
        arm, reason, kind = self._prepared[span]
        opening = self._allowed_opening(span, self._prepared_opening(span, arm))
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
        self._observe(record, span, seconds)
        self.evidence.add(span, record)
        new_span = self.spans.push(text) if text else span
        self.steps += 1
        self.dwell += 1
        self.tokens += record.committed
        self.context = record.context_len

        if self.probe is not None:
            self.probe.remaining -= 1
            self.probe_steps += 1
            self.budget -= 1
            if self.probe.remaining <= 0 or new_span != span:
                self._end_probe(span)
        if self._opening is not None:
            opened, self._opening = self._opening, None
            if new_span == span == opened:
                return self._end_opening(span)
        if self._retry is not None:
            retried, self._retry = self._retry, None
            if new_span == span == retried:
                return self._end_retry(span)
        if new_span != span:
            self._reset_rechecks()
            self._selected = None
            early = self.steps <= _PREPARED_STEPS
            if early:
                # The reads `prepare` made beside the prefill stand in for fresh ones: at
                # most a few of this request's own cycles newer (of a sample half-life of
                # hundreds), and a short turn's whole decode is a few cycles.
                self._tp = dict(self._prepared_reads)
                self._tp_step = self.steps
            rule = self.policy.rule(self.label, new_span)
            arm, reason, kind = self._choose(rule, new_span, self.arm, fresh_block=True)
            if self._overruled(arm, new_span):
                arm, reason = AR, f"{new_span}: this request's own acceptance chose ar here"
            # Each span of the request opens as the request does: where the class says AR,
            # one spec cycle reads this request's own acceptance in the span (a tool call
            # that copies names and paths from its context accepts whole blocks where the
            # class's other tool calls accept little).
            if early:
                candidate = self._prepared_opening(new_span, arm)
            else:
                candidate = self._opening_candidate(rule, new_span, arm)
            opening = self._allowed_opening(new_span, candidate)
            if opening is not None and new_span not in self._own_ar:
                return self._open(opening, reason, new_span)
            return self._set(arm, kind, reason, new_span)
        if self.probe is None:
            rule = self.policy.rule(self.label, span)
            # Once an arm has settled (min_dwell steps), then at each recheck: first whether a
            # known arm beats it outright (switch), only then whether to explore. Probing other
            # block sizes while a measured arm is clearly faster would only delay the switch
            # (a cold class whose prior was too optimistic spent 32 steps so).
            if self.arm == AR and span in self._own_ar:
                waited = self.steps - self._own_ar_at[span]
                if waited >= self._own_ar_wait[span]:
                    self._retry = span
                    block = self._best_block(span)
                    why = f"{span}: one spec{block} cycle after {waited} ar steps"
                    return self._set(("spec", block), "retry", why, span)
            due = self.steps >= self._next_check or self.dwell == self.min_dwell
            if due and self.dwell >= self.min_dwell:
                # A span that runs spec on this request's own acceptance stays on it: the
                # class (which chose AR here) does not rule it, its recent cycles do.
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
                        self._own_ar_at[span] = self.steps
                        self._own_ar_wait.setdefault(span, _RETRY_FIRST)
                        return self._set(AR, "request", why, span)
                    if verdict == "spec" or selected:  # the class mean does not rule
                        self._recheck_done()
                        return self._decision()
            if due and self.dwell >= self.min_dwell:
                arm, reason, kind = self._choose(rule, span, self.arm)
                if arm != self.arm and not self._overruled(arm, span):
                    return self._set(arm, "recheck", reason, span)
            # Where this request's own acceptance chose AR (a lost opening, a request
            # verdict), spec probes would only read again what it already said.
            if due and self.budget > 0 and rule.mode != "ar" and span not in self._read_ar:
                self._maybe_probe(rule, span)
            if due and self.probe is None:
                self._recheck_done()
        return self._decision()

    def finish(self, stats: GenerationStats) -> None:
        self.apply_observations()
        self._publish()
        self._flush_ticks()
        self.est.flush_pooled()
        for (span, mode), n in self._steps.items():
            labels = {"model": self.model_id, "class": self.label, "span": span, "mode": mode}
            self.owner.count("steps", n, **labels)
            self.owner.count("tokens", self._tokens[(span, mode)], **labels)
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

    # -- what the response carries --------------------------------------------------------------
    @property
    def decisions(self) -> list[dict[str, Any]]:
        """The decisions made so far (at most `max_recorded`), as the response lists them."""
        self._publish()
        return self._entries

    def summary(self) -> dict[str, Any]:
        """JSON-able account for the response's `toolflash` object."""
        return {
            "policy": "adaptive",
            "class": self.label,
            "span": self.spans.kind,
            "switches": self.switches,
            "probes": self.probes,
            "probe_steps": self.probe_steps,
            "openings": self.openings,
            "decisions": list(self.decisions),
            "decisions_dropped": self.dropped,
        }

    # -- internals ------------------------------------------------------------------------------
    def _observe(self, record: CycleRecord, span: str, seconds: float) -> None:
        """Count the step and queue it for the estimates (`apply_observations` adds it before
        the next fresh read, or at finish): a step that decides nothing, or only from
        prepared reads, does no estimate work on the decode path."""
        selected = record.mode == "spec" and span == self._selected
        self._unapplied.append((record, span, seconds, self.arm, selected))
        self._ticks[span] = self._ticks.get(span, 0) + 1
        # Counted here, published to the process-wide counters once, at `finish`.
        key = (span, record.mode)
        self._steps[key] = self._steps.get(key, 0) + 1
        self._tokens[key] = self._tokens.get(key, 0) + record.committed

    def apply_observations(self) -> None:
        """Add the queued steps to the estimates, in order (before every fresh read, and at
        finish; a reader of the estimates mid-request calls it first)."""
        if self._unapplied:
            queued, self._unapplied = self._unapplied, []
            for step in queued:
                self._apply(*step)

    def _apply(
        self, record: CycleRecord, span: str, seconds: float, arm: Arm, selected: bool
    ) -> None:
        """One step's measurement into the estimates (`measure.observe_step`); `arm` is the
        one it ran under."""
        observe_step(
            self.est, self.policy, self.model_id, self.label, record, span, seconds, arm, selected
        )

    def _arms(self, rule: SpanRule) -> list[Arm]:
        blocks = [b for b in rule.block_sizes if b <= self.max_block] or [self.max_block]
        arms: list[Arm] = [("spec", b) for b in blocks] if rule.mode != "ar" else []
        if rule.mode != "spec":
            arms.append(AR)
        return arms

    def _recheck_done(self) -> None:
        """A recheck that kept the arm and started no probe: the next one comes twice as late
        (up to `recheck_max` steps). Where the choice is clear, rechecking every few steps
        costs more than it can find (a recheck is ~10 estimate reads; an AR step of a small
        model is a few ms); any decision resets the interval (`_set`)."""
        if self.dwell >= self.min_dwell:
            self._interval = min(self._interval * 2, self.recheck_max)
        self._next_check = self.steps + self._interval

    def _reset_rechecks(self) -> None:
        """A decision or a new span: recheck at the base interval again."""
        self._interval = self.recheck_every
        self._next_check = self.steps + self.recheck_every

    def _throughput(self, arm: Arm, span: str) -> Throughput:
        return self._estimate(arm, span)[0]

    def _estimate(self, arm: Arm, span: str) -> tuple[Throughput, float]:
        """(throughput, tau) of an arm here, computed once per step (a decision asks for the
        same arms several times: to choose, to explain, to record the surplus)."""
        if self._tp_step != self.steps:
            self._tp.clear()
            self._tp_step = self.steps
        key = (arm, span)
        found = self._tp.get(key)
        if found is None:
            self.apply_observations()
            if arm[0] == "ar":
                found = (self.est.ar(self.model_id, self.context, self.label, span), 0.0)
            else:
                found = self.est.spec(self.model_id, self.label, span, arm[1], self.context)
            self._tp[key] = found
        return found

    def _choose(
        self, rule: SpanRule, span: str, current: Arm | None, fresh_block: bool = False
    ) -> tuple[Arm, str, str]:
        """(arm, reason, kind): the arm for `span`, keeping `current` unless another arm is
        faster by the margin with enough confidence. With `fresh_block` (a span's first
        decision), a spec `current` first takes the span's settled block size."""
        arms = self._arms(rule)
        if len(arms) == 1:
            return arms[0], f"{span}: policy mode {rule.mode}", "forced"
        kind = "start" if current is None else "span"
        est = {a: self._throughput(a, span) for a in arms}
        known = [a for a in arms if est[a].known]
        if current not in arms:
            if not any(a[0] == "spec" for a in known):
                # Nothing measured for spec here: start optimistic (or as configured); the
                # first cycles measure it, and a probe covers the other side.
                initial = self.policy.decisions.initial_mode
                arm = AR if (initial == "ar" or not arms[0][0] == "spec") else arms[0]
                if arm not in arms:
                    arm = arms[0]
                return arm, f"{span}: spec not measured yet, initial {arm_name(arm)}", kind
            current = max(known, key=lambda a: est[a].tps)
            if current[0] == "spec":
                current = self._settled_block(known, est, rule)
            return current, f"{span}: fastest known {self._fmt(current, est)}", kind
        assert current is not None
        if fresh_block and current[0] == "spec":
            # A new span: its block size is chosen afresh among the measured spec blocks, as at
            # the start (changing the block costs nothing and cannot flap within the span);
            # spec vs AR keeps the hysteresis below. A block chosen for a short reasoning span
            # otherwise carried into the tool call after it (8 where 16 commits twice as much).
            spec_known = [a for a in known if a[0] == "spec"]
            if spec_known:
                current = self._settled_block(spec_known, est, rule)
        cur = est[current]
        if not cur.known:
            return current, f"{span}: keep {arm_name(current)} (not measured here yet)", kind
        best, best_p = current, 0.0
        for a in known:
            if a == current:
                continue
            p = p_better(est[a], cur)
            if (
                est[a].tps > cur.tps * (1.0 + rule.switch_margin)
                and p >= rule.min_confidence
                and est[a].tps > est[best].tps
            ):
                best, best_p = a, p
        if best == current:
            verb = "keep" if current == self.arm else "block size for this span:"
            return current, f"{span}: {verb} {self._fmt(current, est)}", kind
        return (
            best,
            f"{span}: {self._fmt(best, est)} beats {self._fmt(current, est)} (p={best_p:.2f})",
            kind,
        )

    @staticmethod
    def _settled_block(known: list[Arm], est: dict[Arm, Throughput], rule: SpanRule) -> Arm:
        """The largest measured spec block, unless a smaller one is faster by the switch
        margin with confidence; then, among those, the largest within the margin of the
        fastest. The decided block is a ceiling: the engine's adaptive draft length shrinks
        it after drafts that miss, but cannot grow past it. And a smaller block's cycles say
        nothing of what a larger one would commit once they are accepted whole, so near-equal
        estimates favoured the smaller block for good (a reasoning span of one or two cycles
        settled on 8 and cost a cycle a request against always-spec at 16)."""
        spec = [a for a in known if a[0] == "spec"]
        largest = max(spec, key=lambda a: a[1])
        top = est[largest]
        winners = [
            a
            for a in spec
            if est[a].tps > top.tps * (1.0 + rule.switch_margin)
            and p_better(est[a], top) >= rule.min_confidence
        ]
        if not winners:
            return largest
        fastest = max(est[a].tps for a in winners)
        near = [a for a in winners if est[a].tps * (1.0 + rule.switch_margin) >= fastest]
        return max(near, key=lambda a: a[1])

    @staticmethod
    def _fmt(arm: Arm, est: dict[Arm, Throughput]) -> str:
        t = est.get(arm, UNKNOWN)
        if not t.known:
            return f"{arm_name(arm)} ?"
        return f"{arm_name(arm)} {t.tps:.0f}±{t.std:.0f} tok/s"

    def _maybe_probe(self, rule: SpanRule, span: str) -> None:
        if self.dwell < self.min_dwell:
            return
        self.apply_observations()
        self._flush_ticks()
        scope = (self.model_id, self.label, span)
        cur = self._throughput(self.arm, span)
        best: tuple[int, float, Arm, str] | None = None
        arms = self._arms(rule)
        # A probe is worth it only if the arm could beat the best arm known here (not merely
        # the current one, which may itself be about to lose).
        known = [t for t in (self._throughput(a, span) for a in arms) if t.known]
        top = max([cur, *known], key=lambda t: t.tps if t.known else -1.0)
        largest = max((a[1] for a in arms if a[0] == "spec"), default=0)
        for arm in arms:
            if arm == self.arm or not self.state.backoff.allowed(scope, arm):
                continue
            if (
                arm[0] == "spec"
                and arm[1] != largest
                and self.est.measured_tau(self.model_id, self.label, span, arm[1]) is None
            ):
                # Tau is unknown here for every block alike; a probe at the largest block
                # measures it for all of them (smaller blocks are credited from its cycles).
                continue
            alt = self._throughput(arm, span)
            if (
                arm[0] == "spec"
                and self.explore.skip_hopeless
                and not self._could_win(arm, span, top, rule)
            ):
                continue
            why = probe_reason(
                alt,
                cur,
                min_samples=rule.min_samples,
                explore_p=self.explore.explore_p,
                min_confidence=rule.min_confidence,
            )
            if why is None:
                continue
            rank = (0 if why == "few-samples" else 1, -p_better(alt, cur), arm, why)
            if best is None or rank < best:
                best = rank
        if best is None:
            return
        arm, why = best[2], best[3]
        length = self.explore.probe_ar_steps if arm == AR else self.explore.probe_spec_cycles
        length = min(length, self.budget)
        self.probe = Probe(arm=arm, base=self.arm, remaining=length, reason=why)
        self.probes += 1
        self._set(arm, "probe", f"{span}: probe {arm_name(arm)} for {length} steps ({why})", span)

    def _could_win(self, arm: Arm, span: str, cur: Throughput, rule: SpanRule) -> bool:
        """Whether spec at this block could beat `cur` at all: a cycle costs at least one AR
        step (it runs a target forward of the block, plus the draft), so spec is bounded by
        measured tau x AR tok/s. Where tau is that low, probing block sizes is pure loss."""
        self.apply_observations()
        tau = self.est.measured_tau(self.model_id, self.label, span, arm[1])
        ar = self.est.ar(self.model_id, self.context)
        if tau is None or not ar.known or not cur.known:
            return True
        # Forced runs (measured) lift the bound by their share, as they lift the estimate.
        bound = Throughput(tau * ar.tps, 0.0, 0.0)
        bound = self.est.with_forced(self.model_id, self.label, span, arm[1], bound)
        return bound.tps > cur.tps * (1.0 + rule.switch_margin)

    def _end_probe(self, span: str) -> None:
        probe = self.probe
        assert probe is not None
        self.probe = None
        self._flush_ticks()
        scope = (self.model_id, self.label, span)
        rule = self.policy.rule(self.label, span)
        alt = self._throughput(probe.arm, span)
        base = self._throughput(probe.base, span)
        p = p_better(alt, base)
        won = (
            alt.known
            and base.known
            and alt.tps > base.tps * (1.0 + rule.switch_margin)
            and p >= rule.min_confidence
        )
        outcome = "won" if won else "lost"
        self.owner.count(
            "probes",
            model=self.model_id,
            outcome=outcome,
            arm=arm_name(probe.arm),
            span=span,
            **{"class": self.label},
        )
        est = {probe.arm: alt, probe.base: base}
        if won:
            self.state.backoff.won(scope, probe.arm)
            reason = (
                f"{span}: probe won, {self._fmt(probe.arm, est)} vs {self._fmt(probe.base, est)}"
            )
            self._set(probe.arm, "probe-won", reason, span)
        else:
            wait = self.state.backoff.lost(scope, probe.arm)
            reason = (
                f"{span}: probe lost, {self._fmt(probe.arm, est)} vs {self._fmt(probe.base, est)}"
                f" (p={p:.2f}); next probe in {wait} steps"
            )
            # Back to the base, unless what is known now says another arm beats it outright.
            arm, why, _ = self._choose(rule, span, probe.base)
            if arm != probe.base:
                reason = f"{reason}; {why}"
            self._set(arm, "probe-lost", reason, span)

    def _allowed_opening(self, span: str, candidate: Arm | None) -> Arm | None:
        """`candidate` (see `_opening_candidate`) where the opening backoff allows it (asking
        consumes a skip)."""
        if candidate is None or not self.state.opening.allowed((self.model_id, self.label, span)):
            return None
        return candidate

    def _prepared_opening(self, span: str, arm: Arm) -> Arm | None:
        """`_opening_candidate` as `prepare` read it."""
        return self._opening_if_ar[span] if arm == AR else None

    def _opening_candidate(self, rule: SpanRule, span: str, arm: Arm) -> Arm | None:
        """The spec arm to open this span with, where the class chose AR and the opening
        probe is on and judgeable (AR and the cycle time measured); the backoff is asked
        apart (`_allowed_opening`), as a read must not consume its skips."""
        if not self.explore.opening_probe or arm != AR or rule.mode != "adaptive":
            return None
        self.apply_observations()
        spec = [a for a in self._arms(rule) if a[0] == "spec"]
        if not spec:
            return None
        largest = max(spec, key=lambda a: a[1])
        if not self._throughput(AR, span).known:
            return None
        # A span with grammar-forced runs cannot be judged by one drafted cycle (see
        # RequestEvidence); the class estimates count those runs.
        model, label = self.model_id, self.label
        if self.est.forced_share(model, label, span) or self.est.ar_forced_share(
            model, label, span
        ):
            return None
        if self.est.cycle_seconds(self.model_id, largest[1], self.context) is None:
            return None
        return largest

    def _open(self, arm: Arm, reason: str, span: str) -> ModeDecision:
        """Start an opening probe of `span`: one `arm` cycle, judged at the next step."""
        self._opening = span
        self.openings += 1
        reason = f"{reason}; opening probe: one {arm_name(arm)} cycle reads this request"
        return self._set(arm, "opening", reason, span)

    def _overruled(self, arm: Arm, span: str) -> bool:
        """Whether the class's choice of `arm` yields to this request's own evidence: a spec
        arm in a span where the request's acceptance already chose AR (`_own_ar` only holds
        adaptive spans, so AR is an option there)."""
        return arm[0] == "spec" and span in self._own_ar

    def _request_verdict(
        self, rule: SpanRule, span: str, tau: float | None
    ) -> tuple[str, str] | None:
        """(verdict, reason) from this request's own tokens per cycle at the current block,
        or None when there is not enough of it (or AR is not an option here)."""
        if tau is None or rule.mode != "adaptive" or self.arm[0] != "spec":
            return None
        self.apply_observations()
        cycle_s = self.est.cycle_seconds(self.model_id, self.arm[1], self.context)
        ar = self._throughput(AR, span)
        if cycle_s is None or not ar.known:
            return None
        verdict = local_verdict(tau, cycle_s, ar.tps, rule.switch_margin)
        why = (
            f"{span}: this request's {arm_name(self.arm)} {tau / cycle_s:.0f} tok/s "
            f"(tau {tau:.2f}, {self.evidence.cycles(span)} cycles) vs ar {ar.tps:.0f} tok/s"
        )
        return verdict, why

    def _end_retry(self, span: str) -> ModeDecision:
        """The verdict on a retry cycle in a span this request had moved to AR: its tokens per
        cycle over the window, the retry included, against AR. Won: spec again, and the
        class estimates rule the span once more; lost: AR, retried twice as late."""
        rule = self.policy.rule(self.label, span)
        own = self._request_verdict(rule, span, self.evidence.tau(span, min_cycles=1))
        if own is not None and own[0] == "spec":
            self._own_ar.discard(span)
            self._own_ar_wait[span] = _RETRY_FIRST
            self._selected = span
            return self._set(self.arm, "retry-won", own[1], span)
        self._own_ar_at[span] = self.steps
        self._own_ar_wait[span] = min(2 * self._own_ar_wait[span], _RETRY_MAX)
        why = own[1] if own is not None else f"{span}: retry not judgeable"
        return self._set(AR, "retry-lost", why, span)

    def _end_opening(self, span: str) -> ModeDecision:
        """The opening probe's verdict from its one cycle: stay speculative when it beat AR,
        else back to AR (the class's choice)."""
        scope = (self.model_id, self.label, span)
        rule = self.policy.rule(self.label, span)
        own = self._request_verdict(rule, span, self.evidence.tau(span, min_cycles=1))
        if own is None:
            # Not judgeable (the cycle met a forced run): no verdict, no backoff; the class's
            # estimates choose, as they would have without the probe.
            arm, why, _ = self._choose(rule, span, None)
            return self._set(arm, "opening-void", f"{why} (opening probe not judgeable)", span)
        won = own[0] == "spec"
        why = own[1]
        self.owner.count(
            "openings",
            model=self.model_id,
            outcome="won" if won else "lost",
            span=span,
            **{"class": self.label},
        )
        if won:
            self.state.opening.won(scope)
            self._selected = span
            self._read_ar.discard(span)
            return self._set(self.arm, "opening-won", why, span)
        wait = self.state.opening.lost(scope)
        self._read_ar.add(span)
        return self._set(AR, "opening-lost", f"{why}; the next {wait} openings skipped", span)

    def _set(self, arm: Arm, kind: str, reason: str, span: str) -> ModeDecision:
        changed = arm != self.arm
        if changed and kind not in _NOT_SWITCHES:
            self.switches += 1
        if changed or kind in _RECORDED_KINDS:
            self.dwell = 0
            self._reset_rechecks()
            block = arm[1] if arm[0] == "spec" else self._best_block(span)
            spec, tau = self._estimate(("spec", block), span)
            surplus = Surplus(spec, self._throughput(AR, span), tau, block)
            # Only the record is made here, between decode steps; its dict, log line and
            # counter are made by `_publish` (at finish, or when enough have queued).
            self._pending.append(_Record(self.steps, self.tokens, span, arm, kind, reason, surplus))
            if len(self._pending) >= _PUBLISH_EVERY:
                self._publish()
        self.arm = arm
        self.reason = reason
        return self._decision()

    def _publish(self) -> None:
        """Turn the queued decision records into the response's entries, log lines (in order,
        each with the step it was made at) and `decisions` counters."""
        pending, self._pending = self._pending, []
        for rec in pending:
            arm = rec.arm
            entry: dict[str, Any] = {
                "step": rec.step,
                "tokens": rec.tokens,
                "span": rec.span,
                "mode": arm[0],
                "block_size": arm[1] if arm[0] == "spec" else None,
                "kind": rec.kind,
                "reason": rec.reason,
                **rec.surplus.as_dict(),
            }
            if len(self._entries) < self.max_recorded:
                self._entries.append(entry)
            else:
                self.dropped += 1
            self.owner.count(
                "decisions",
                model=self.model_id,
                span=rec.span,
                mode=arm[0],
                kind=rec.kind,
                **{"class": self.label},
            )
            log.info(
                "policy.decision",
                model=self.model_id,
                request_class=self.label,
                **{k: v for k, v in entry.items() if k not in ("block_size", "mode")},
                mode=arm_name(arm),
            )

    def _best_block(self, span: str) -> int:
        rule = self.policy.rule(self.label, span)
        arms = [a for a in self._arms(rule) if a[0] == "spec"]
        if not arms:
            return max(b for b in rule.block_sizes)
        return max(arms, key=lambda a: self._throughput(a, span).tps)[1]

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

    def _flush_ticks(self) -> None:
        """Add the steps counted since the last flush to the process-wide backoff clock (kept
        per request between decisions so the per-step path stays small)."""
        for span, n in self._ticks.items():
            self.state.backoff.tick((self.model_id, self.label, span), n)
        self._ticks.clear()
