"""What one request's controller reads from the estimates, and when the estimates learn its steps.

A short agent turn decodes in a few cycles of a few ms, so the work between decode steps is kept
to the least: `StepReads` reads each (arm, span) estimate once per step (a decision asks for the
same arms several times: to choose, to explain, to record the surplus); `prepare` reads ahead on
the prefill's thread, and the reads it made stand in for fresh ones in the request's first steps;
a step's measurement is queued (`observe`) and added to the estimates before the next fresh read
or at finish (`fresh`), in order. It also tallies the steps and tokens per span and mode that the
controller publishes at finish, and the steps per span the probe backoff's clock has not seen.
"""

from __future__ import annotations

from toolflash.engine.api import CycleRecord

from .config import EffectivePolicy
from .decide import Arm
from .estimates import Estimates
from .measure import FirstLookups, observe_step
from .throughput import Throughput

Read = tuple[Throughput, float]  # throughput, tokens per cycle or step (0 for AR)


class StepReads:
    """The estimate reads and queued measurements of one request (one thread at a time)."""

    def __init__(self, est: Estimates, policy: EffectivePolicy, model_id: str, label: str) -> None:
        self.est = est
        self.policy = policy
        self.model_id = model_id
        self.label = label
        self.context = 0
        self.step = 0  # steps observed: the reads are cached for one step
        self._cache: dict[tuple[Arm, str], Read] = {}
        self._cache_step = -1
        self._prepared: dict[tuple[Arm, str], Read] = {}
        # Steps not yet added to the estimates: (record, span, seconds, the arm it ran under,
        # selected by this request's own acceptance, settling: among the arm's first steps,
        # the request's first lookup step in its span and block).
        self._queue: list[tuple[CycleRecord, str, float, Arm, bool, bool, bool]] = []
        self._lookups = FirstLookups()
        # Published at finish (`steps`, `tokens` per (span, mode)), and flushed to the probe
        # backoff's clock before a probe decision (`ticks` per span).
        self.steps: dict[tuple[str, str], int] = {}
        self.tokens: dict[tuple[str, str], int] = {}
        self.ticks: dict[str, int] = {}

    # -- steps ------------------------------------------------------------------------------
    def observe(
        self,
        record: CycleRecord,
        span: str,
        seconds: float,
        arm: Arm,
        selected: bool,
        settling: bool = False,
    ) -> None:
        """Count a step and queue its measurement (a step that decides nothing, or only from
        prepared reads, does no estimate work); `settling`: see `measure.observe_step`."""
        first = self._lookups.first(arm, span, record.mode)
        self._queue.append((record, span, seconds, arm, selected, settling, first))
        self.ticks[span] = self.ticks.get(span, 0) + 1
        key = (span, record.mode)
        self.steps[key] = self.steps.get(key, 0) + 1
        self.tokens[key] = self.tokens.get(key, 0) + record.committed
        self.step += 1
        self.context = record.context_len

    def fresh(self) -> Estimates:
        """The estimates with every queued step added, in order."""
        if self._queue:
            queued, self._queue = self._queue, []
            est, policy, model, label = self.est, self.policy, self.model_id, self.label
            for record, span, seconds, arm, selected, settling, first in queued:
                observe_step(
                    est, policy, model, label, record, span, seconds, arm, selected, settling, first
                )
        return self.est

    def take_ticks(self) -> dict[str, int]:
        ticks, self.ticks = self.ticks, {}
        return ticks

    # -- reads ------------------------------------------------------------------------------
    def estimate(self, arm: Arm, span: str) -> Read:
        """(throughput, tau) of an arm in `span` at this context, read once per step."""
        if self._cache_step != self.step:
            self._cache.clear()
            self._cache_step = self.step
        key = (arm, span)
        found = self._cache.get(key)
        if found is None:
            est = self.fresh()
            if arm[0] == "ar":
                found = (est.ar(self.model_id, self.context, self.label, span), 0.0)
            elif arm[0] == "lookup":
                found = est.lookup(self.model_id, self.label, span, arm[1])
            else:
                found = est.spec(self.model_id, self.label, span, arm[1], self.context)
            self._cache[key] = found
        return found

    def throughput(self, arm: Arm, span: str) -> Throughput:
        return self.estimate(arm, span)[0]

    def spec_bound(self, block: int, span: str) -> Throughput | None:
        """Spec at `block` at its best: every cycle as cheap as one AR step (measured tau x AR
        tok/s) or as full as its block (`block` tokens per measured cycle), whichever is lower
        of those known, forced runs mixed in (None when neither is). See `decide.could_win`."""
        est = self.fresh()
        bounds = []
        tau = est.measured_tau(self.model_id, self.label, span, block)
        ar = est.ar(self.model_id, self.context)
        if tau is not None and ar.known:
            bounds.append(tau * ar.tps)
        cycle_s = est.cycle_seconds(self.model_id, block, self.context)
        if cycle_s is not None:
            bounds.append(block / cycle_s)
        if not bounds:
            return None
        bound = Throughput(min(bounds), 0.0, 0.0)
        return est.with_forced(self.model_id, self.label, span, block, bound)

    def measured_tau(self, span: str, block: int) -> float | None:
        return self.fresh().measured_tau(self.model_id, self.label, span, block)

    def cycle_seconds(self, block: int) -> float | None:
        return self.fresh().cycle_seconds(self.model_id, block, self.context)

    def has_forced_runs(self, span: str) -> bool:
        """Whether grammar-forced runs were measured in this class and span (either mode)."""
        est, model, label = self.fresh(), self.model_id, self.label
        return bool(est.forced_share(model, label, span) or est.ar_forced_share(model, label, span))

    # -- reads made ahead ---------------------------------------------------------------------
    def begin_prepare(self, context: int) -> None:
        """`prepare` reads at `context`, from an empty cache."""
        self.context = context
        self._cache.clear()
        self._cache_step = self.step

    def keep_prepared(self) -> None:
        """Keep the reads made so far as the prepared ones."""
        self._prepared = dict(self._cache)

    def use_prepared(self) -> None:
        """This step reads what `prepare` read (at most a few of this request's own cycles older,
        of a sample half-life of hundreds)."""
        self._cache = dict(self._prepared)
        self._cache_step = self.step
