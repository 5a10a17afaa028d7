"""One request's trials (`trial.py`): when each begins, how each is judged, what its verdict
decides, and what this request's own acceptance decided per span kind.

`RequestTrials` holds the trial in flight and returns each decision it makes (arm, reason,
kind) for the controller to record and follow; it reads the estimates through the controller's
`StepReads` and asks the controller (`TrialHost`) to choose among the class's arms where a
verdict hands the span back to the class.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Protocol

from toolflash.engine.api import CycleRecord

from . import decide
from .config import EffectivePolicy, SpanRule
from .decide import AR, Arm, Choice, arm_name
from .reads import StepReads
from .request_evidence import RequestEvidence
from .trial import Backoff, Trial, probe_target, retry_backoff

# Steps outside trials a probe's own verdict reads the base arm from.
_RECENT_STEPS = 8


class TrialHost(Protocol):
    """What a request's trials read of its controller."""

    arm: Arm
    steps: int
    dwell: int
    reads: StepReads

    def arms(self, rule: SpanRule) -> list[Arm]: ...

    def choose(self, rule: SpanRule, span: str, current: Arm | None) -> Choice: ...

    def best_block(self, span: str) -> int: ...


class RequestTrials:
    """One request's trials: the one in flight (`current`), and what this request's own
    acceptance decided per span: spans it moved to AR (`own_ar`: the class estimates do not
    switch them back, retries may), spans where its own cycles said AR (`read_ar`: no spec
    probes there), and the span running spec because its own acceptance won (`selected`: its
    cycles are no measure of the class, which would otherwise learn from the requests that won
    alone). Each method returns the decision to make (arm, reason, kind) or None; the
    controller makes it."""

    def __init__(
        self,
        host: TrialHost,
        policy: EffectivePolicy,
        model_id: str,
        label: str,
        probes: Backoff,
        openings: Backoff,
        count: Callable[..., None],
    ) -> None:
        self.host = host
        self.policy = policy
        self.explore = policy.exploration
        self.model_id = model_id
        self.label = label
        self.probes_backoff = probes
        self.openings_backoff = openings
        self.count = count
        self.current: Trial | None = None
        self.evidence = RequestEvidence(policy.decisions.request_evidence_cycles)
        self.retries = retry_backoff(lambda: host.steps)
        self.own_ar: set[str] = set()
        self.read_ar: set[str] = set()
        self.selected: str | None = None
        self.budget = self.explore.budget_per_request
        self.probes = self.probe_steps = self.openings = 0
        # Cycles in a row that accepted the whole block the current arm decided (`grow`), the
        # tokens each step of the probe in flight committed (a grow probe's: its cycles that
        # measure the block), and (span, arm, tokens) of the last steps outside trials.
        self.whole = 0
        self._trial_tokens: list[int] = []
        self._recent: deque[tuple[str, Arm, int]] = deque(maxlen=_RECENT_STEPS)

    def _scope(self, span: str) -> tuple[str, str, str]:
        return (self.model_id, self.label, span)

    def observe(self, span: str, record: CycleRecord) -> None:
        """A step of this request: its own evidence, the run of whole-block cycles at the
        decided block (a shorter cycle accepted whole, as the engine's draft length grows back
        to the block, neither counts nor breaks it; any rejection does), and a grow probe's
        tokens per cycle (its cycles that say what the probed block commits)."""
        self.evidence.add(span, record)
        trial = self.current
        if trial is None:
            self._recent.append((span, self.host.arm, record.committed))
        elif trial.kind == "probe":
            self._trial_tokens.append(record.committed)
        if record.mode != "spec" or record.forced or record.draft_cut or record.drafted <= 0:
            return
        if trial is not None and trial.kind == "grow":
            # A shorter cycle accepted whole (max_tokens cut it, or the draft length is growing
            # back) is censored too, a lower bound only: left out of the verdict.
            if record.block_size == trial.arm[1] or record.accepted < record.drafted:
                self._trial_tokens.append(record.committed)
        if record.accepted < record.drafted:
            self.whole = 0
        elif record.block_size == self.host.arm[1]:
            self.whole += 1

    def step(self, span: str, new_span: str) -> tuple[Choice | None, bool]:
        """Count a step of the trial in flight; at its end, (its verdict, whether the verdict is
        the step's decision): a probe's is made and the step decides on; an opening's or
        retry's is the step's decision, unless the span changed (then it is dropped)."""
        trial = self.current
        assert trial is not None
        trial.remaining -= 1
        if trial.kind in ("probe", "grow"):
            self.probe_steps += 1
            self.budget -= 1
        if trial.remaining > 0 and new_span == span:
            return None, False
        self.current = None
        if trial.kind == "probe":
            return self._end_probe(trial, span), False
        if not new_span == span == trial.span:
            return None, False
        if trial.kind == "opening":
            return self._end_opening(span), True
        if trial.kind == "grow":
            return self._end_grow(trial, span), True
        return self._end_retry(span), True

    def flush_ticks(self) -> None:
        """Add the steps counted since the last flush to the process-wide probe backoff's clock
        (kept per request between decisions so the per-step path stays small)."""
        for span, n in self.host.reads.take_ticks().items():
            self.probes_backoff.tick(self._scope(span), n)

    # -- probes -----------------------------------------------------------------------------
    def probe(self, rule: SpanRule, span: str) -> Choice | None:
        """A probe of the arm most worth one, where the estimates are uncertain and the
        backoff and the request's budget allow."""
        host = self.host
        if host.dwell < self.policy.decisions.min_dwell:
            return None
        reads = host.reads
        reads.fresh()
        self.flush_ticks()
        scope = self._scope(span)
        allowed = host.arms(rule)
        est = {a: reads.throughput(a, span) for a in allowed}
        cur = reads.throughput(host.arm, span)
        # A probe is worth it only if the arm could beat the best arm known here (not merely
        # the current one, which may itself be about to lose).
        known = [t for t in est.values() if t.known]
        top = max([cur, *known], key=lambda t: t.tps if t.known else -1.0)
        largest = max((a[1] for a in allowed if a[0] == "spec"), default=0)
        candidates = [
            arm
            for arm in allowed
            if arm != host.arm
            and self.probes_backoff.allowed(scope, self._waits_on(arm))
            # Tau is unknown here for every block alike; a probe at the largest block measures
            # it for all of them (smaller blocks are credited from its cycles).
            and not (
                arm[0] == "spec" and arm[1] != largest and reads.measured_tau(span, arm[1]) is None
            )  # fmt: skip
            and not (
                arm[0] == "spec"
                and self.explore.skip_hopeless
                and not decide.could_win(reads.spec_bound(arm[1], span), top, rule)
            )
        ]
        picked = decide.pick_probe(
            candidates, est, cur, rule, self.explore.explore_p, self.explore.prior_veto
        )
        if picked is None:
            return None
        arm, why = picked
        length = self._length(arm)
        # The arm most worth a probe waits for its share rather than yield to a shorter one.
        if not decide.probe_fits(self.probe_steps, length, host.steps, self.explore.probe_share):
            return None
        self.current = Trial("probe", span, arm, host.arm, length)
        self._trial_tokens = []
        self.probes += 1
        return arm, f"{span}: probe {arm_name(arm)} for {length} steps ({why})", "probe"

    def _length(self, arm: Arm) -> int:
        """Steps a probe of `arm` runs (lookup steps are AR steps where nothing matches:
        probed as long as AR), within what is left of the request's budget."""
        spec = arm[0] == "spec"
        length = self.explore.probe_spec_cycles if spec else self.explore.probe_ar_steps
        return min(length, self.budget)

    def _end_probe(self, probe: Trial, span: str) -> Choice:
        self.flush_ticks()
        scope = self._scope(span)
        rule = self.policy.rule(self.label, span)
        reads = self.host.reads
        est = {probe.arm: reads.throughput(probe.arm, span)}
        est[probe.base] = reads.throughput(probe.base, span)
        won = decide.beats(est[probe.arm], est[probe.base], rule)
        own = (
            self._own_verdict(probe, span, rule)
            if self.explore.probe_verdict == "request"
            else None
        )
        if own is not None:
            won = own[0] == "spec"
        self._count_probe(probe.arm, span, won)
        vs = f"{decide.fmt(probe.arm, est)} vs {decide.fmt(probe.base, est)}"
        if own is not None:
            vs = f"{own[1]} (class: {vs})"
        if won:
            self.probes_backoff.won(scope, self._waits_on(probe.arm))
            return probe.arm, f"{span}: probe won, {vs}", "probe-won"
        wait = self.probes_backoff.lost(scope, self._waits_on(probe.arm))
        p = decide.p_better(est[probe.arm], est[probe.base])
        reason = f"{span}: probe lost, {vs} (p={p:.2f}); next probe in {wait} steps"
        # Back to the base, unless what is known now says another arm beats it outright.
        arm, why, _ = self.host.choose(rule, span, probe.base)
        if arm != probe.base:
            reason = f"{reason}; {why}"
        return arm, reason, "probe-lost"

    def _count_probe(self, arm: Arm, span: str, won: bool) -> None:
        outcome = "won" if won else "lost"
        labels = {"class": self.label}
        self.count(
            "probes", model=self.model_id, outcome=outcome, arm=arm_name(arm), span=span, **labels
        )

    def _own_verdict(self, probe: Trial, span: str, rule: SpanRule) -> tuple[str, str] | None:
        """(verdict, why) from this request's own tokens per step under the probe against its
        last steps in the span under the base arm, each at the class's step time; None when
        either is missing."""
        base = [n for s, a, n in self._recent if s == span and a == probe.base]
        probe_s, base_s = self._step_seconds(probe.arm, span), self._step_seconds(probe.base, span)
        if not base or probe_s is None or base_s is None:
            return None
        base_tps = sum(base) / len(base) / base_s
        return self._trial_verdict(probe.arm, probe_s, arm_name(probe.base), base_tps, rule)

    def _trial_verdict(
        self, arm: Arm, arm_s: float, base: str, base_tps: float, rule: SpanRule
    ) -> tuple[decide.Verdict, str] | None:
        """(verdict, why) of the trial's own steps at `arm` (`arm_s` each) against `base` at
        `base_tps`; None before any step counted."""
        if not self._trial_tokens:
            return None
        tau = sum(self._trial_tokens) / len(self._trial_tokens)
        verdict = decide.local_verdict(tau, arm_s, base_tps, rule.switch_margin)
        why = (
            f"this request's {arm_name(arm)} {tau / arm_s:.0f} tok/s (tau {tau:.2f})"
            f" vs {base} {base_tps:.0f} tok/s"
        )
        return verdict, why

    def _step_seconds(self, arm: Arm, span: str) -> float | None:
        """The class's seconds per step of `arm` here (a spec cycle's at its block)."""
        if arm[0] == "spec":
            return self.host.reads.cycle_seconds(arm[1])
        t, per_step = self.host.reads.estimate(arm, span)
        if not t.known:
            return None
        return (per_step if arm[0] == "lookup" and per_step > 0 else 1.0) / t.tps

    # -- grow probes ------------------------------------------------------------------------
    def grow(self, rule: SpanRule, span: str) -> Choice | None:
        """A grow probe: the next larger block for a probe's cycles, where the current block
        accepted `grow_after` whole blocks in a row (`decide.grow_target`), and the backoff and
        the budget allow."""
        host, grow_after = self.host, self.explore.grow_after
        if not 0 < grow_after <= self.whole:  # the per-step path: most steps end here
            return None
        target = decide.grow_target(host.arm, host.arms(rule), self.whole, grow_after)
        if target is None or rule.mode == "ar" or self.budget <= 0:
            return None
        self.flush_ticks()
        if not self.probes_backoff.allowed(self._scope(span), ("grow", target[1])):
            return None
        # Not held to the probe share: a grow probe follows whole blocks, and a lost one costs
        # its cycles' larger verify, not a worse arm's whole steps.
        length = self._length(target)
        self.current = Trial("grow", span, target, host.arm, length)
        self._trial_tokens = []
        self.probes += 1
        base = arm_name(host.arm)
        why = f"{span}: {self.whole} whole {base} blocks in a row, probe {arm_name(target)}"
        return target, f"{why} for {length} cycles", "grow"

    def _end_grow(self, trial: Trial, span: str) -> Choice:
        """Keep the larger block when its cycles in this request beat whole blocks of the
        smaller one (each at the class's cycle time at this context), else back to it."""
        self.flush_ticks()
        scope, what = self._scope(span), ("grow", trial.arm[1])
        rule = self.policy.rule(self.label, span)
        reads = self.host.reads
        grown_s, base_s = reads.cycle_seconds(trial.arm[1]), reads.cycle_seconds(trial.base[1])
        own = None
        if grown_s is not None and base_s is not None:
            base = f"whole {arm_name(trial.base)} blocks"
            own = self._trial_verdict(trial.arm, grown_s, base, trial.base[1] / base_s, rule)
        won = own is not None and own[0] == "spec"
        vs = "not judgeable" if own is None else own[1]
        self._count_probe(trial.arm, span, won)
        if won:
            self.probes_backoff.won(scope, what)
            return trial.arm, f"{span}: grow probe won, {vs}", "grow-won"
        wait = self.probes_backoff.lost(scope, what)
        return trial.base, f"{span}: grow probe lost, {vs}; next in {wait} steps", "grow-lost"

    # -- openings ---------------------------------------------------------------------------
    def _waits_on(self, arm: Arm) -> Hashable:
        """What a probe of `arm` backs off on (`trial.probe_target`)."""
        return probe_target(arm, self.explore.spec_backoff)

    def opening_candidate(self, rule: SpanRule, span: str, arm: Arm) -> Arm | None:
        """The spec arm to open `span` with (at `opening_block`), where the class chose AR and
        an opening is on, judgeable (AR and the cycle time measured; no grammar-forced runs,
        which one drafted cycle cannot judge) and winnable (a cycle committing its whole block
        would beat AR). The backoff is asked apart (`allowed_opening`): a read must not consume
        its chances."""
        if not self.explore.opening_probe or arm != AR or rule.mode != "adaptive":
            return None
        reads = self.host.reads
        reads.fresh()
        spec = [a for a in self.host.arms(rule) if a[0] == "spec"]
        if not spec:
            return None
        block = max(a[1] for a in spec)
        if self.explore.opening_block == "best":
            block = self.host.best_block(span)
        ar = reads.throughput(AR, span)
        if not ar.known or reads.has_forced_runs(span):
            return None
        cycle_s = reads.cycle_seconds(block)
        if cycle_s is None:
            return None
        # A cycle that commits its whole block must be able to win the verdict, else the
        # opening is a sure loss (a 4-bit target on a CPU: a cycle of 4 costs ~8 AR steps).
        if decide.local_verdict(block, cycle_s, ar.tps, rule.switch_margin) != "spec":
            return None
        return ("spec", block)

    def allowed_opening(self, span: str, candidate: Arm | None) -> Arm | None:
        """`candidate` where the opening backoff allows it (asking is one chance)."""
        if candidate is None or not self.openings_backoff.ask(self._scope(span)):
            return None
        return candidate

    def open(self, arm: Arm, reason: str, span: str) -> Choice:
        """Start an opening trial of `span`: one `arm` cycle, judged at the next step."""
        self.current = Trial("opening", span, arm, AR, 1)
        self.openings += 1
        return (
            arm,
            f"{reason}; opening probe: one {arm_name(arm)} cycle reads this request",
            "opening",
        )

    def _end_opening(self, span: str) -> Choice:
        """Stay speculative when the opening cycle beat AR, else back to AR (the class's choice);
        no verdict (nor backoff) when it met a forced run: the class's estimates choose."""
        rule = self.policy.rule(self.label, span)
        own = self.verdict(rule, span, self.evidence.tau(span, min_cycles=1))
        if own is None:
            arm, why, _ = self.host.choose(rule, span, None)
            return arm, f"{why} (opening probe not judgeable)", "opening-void"
        won = own[0] == "spec"
        self.count(
            "openings",
            model=self.model_id,
            outcome="won" if won else "lost",
            span=span,
            **{"class": self.label},
        )
        if won:
            self.openings_backoff.won(self._scope(span))
            self.selected = span
            self.read_ar.discard(span)
            return self.host.arm, own[1], "opening-won"
        wait = self.openings_backoff.lost(self._scope(span))
        self.read_ar.add(span)
        return AR, f"{own[1]}; the next {wait} openings skipped", "opening-lost"

    # -- this request's own verdicts, retries ---------------------------------------------------
    def verdict(self, rule: SpanRule, span: str, tau: float | None) -> tuple[str, str] | None:
        """(verdict, reason) from this request's own tokens per cycle at the current block, or
        None when there is not enough of it (or AR is not an option here)."""
        arm = self.host.arm
        if tau is None or rule.mode != "adaptive" or arm[0] != "spec":
            return None
        reads = self.host.reads
        cycle_s = reads.cycle_seconds(arm[1])
        ar = reads.throughput(AR, span)
        if cycle_s is None or not ar.known:
            return None
        verdict = decide.local_verdict(tau, cycle_s, ar.tps, rule.switch_margin)
        why = (
            f"{span}: this request's {arm_name(arm)} {tau / cycle_s:.0f} tok/s "
            f"(tau {tau:.2f}, {self.evidence.cycles(span)} cycles) vs ar {ar.tps:.0f} tok/s"
        )
        return verdict, why

    def recheck(self, rule: SpanRule, span: str) -> Choice | bool:
        """At a recheck, this request's own verdict: a decision for AR (`request`), True when it
        keeps the arm (its own cycles say spec, or the span runs on them), else False (the
        class's estimates decide)."""
        # A span that runs spec on this request's own acceptance stays on it: the class (which
        # chose AR here) does not rule it, its recent cycles do.
        selected = span == self.selected
        own = self.verdict(rule, span, self.evidence.tau(span, min_cycles=1 if selected else None))
        if own is None:
            return False
        verdict, why = own
        if verdict == "ar":
            self.selected = None
            self.read_ar.add(span)
            self.own_ar.add(span)
            self.retries.lost(span)
            return AR, why, "request"
        return verdict == "spec" or selected

    def overruled(self, arm: Arm, span: str) -> bool:
        """Whether the class's choice of `arm` yields to this request's own evidence: a spec arm
        in a span where the request's acceptance already chose AR (`own_ar` only holds adaptive
        spans, so AR is an option there)."""
        return arm[0] == "spec" and span in self.own_ar

    def retry(self, span: str) -> Choice | None:
        """One spec cycle in a span this request moved to AR, once its wait is over."""
        if not (self.host.arm == AR and span in self.own_ar and self.retries.allowed(span)):
            return None
        block = self.host.best_block(span)
        self.current = Trial("retry", span, ("spec", block), AR, 1)
        why = f"{span}: one spec{block} cycle after {self.retries.waited(span)} ar steps"
        return ("spec", block), why, "retry"

    def _end_retry(self, span: str) -> Choice:
        """This request's tokens per cycle over the window, the retry included, against AR. Won:
        spec again, and the class estimates rule the span once more; lost: AR, retried twice as
        late."""
        rule = self.policy.rule(self.label, span)
        own = self.verdict(rule, span, self.evidence.tau(span, min_cycles=1))
        if own is not None and own[0] == "spec":
            self.own_ar.discard(span)
            self.retries.won(span)
            self.selected = span
            return self.host.arm, own[1], "retry-won"
        self.retries.lost(span)
        return AR, own[1] if own is not None else f"{span}: retry not judgeable", "retry-lost"
