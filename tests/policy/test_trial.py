"""One Backoff for the three trials (probe, opening, retry), each a configuration of it, and the
step reads that the controller's decisions read through."""

from __future__ import annotations

from toolflash.engine.api import CycleRecord
from toolflash.policy.config import PolicyConfig
from toolflash.policy.estimates import Estimates
from toolflash.policy.reads import StepReads
from toolflash.policy.throughput import Throughput
from toolflash.policy.trial import (
    RETRY_FIRST,
    RETRY_MAX,
    Backoff,
    opening_backoff,
    probe_backoff,
    retry_backoff,
)

from .fakes import ar_record, spec_record

SCOPE = ("m", "chat.think-off.user.lt1k", "text")


def test_one_backoff_free_losses_then_doubling_up_to_the_cap() -> None:
    b = Backoff(first=4, most=20, free=1)
    assert b.allowed(SCOPE) and b.lost(SCOPE) == 0 and b.allowed(SCOPE)  # a free loss
    assert [b.lost(SCOPE) for _ in range(4)] == [4, 8, 16, 20]
    assert b.losses(SCOPE) == 5 and not b.allowed(SCOPE)
    b.tick(SCOPE, 19)
    assert not b.allowed(SCOPE) and b.waited(SCOPE) == 19
    b.tick(SCOPE)
    assert b.allowed(SCOPE)
    b.won(SCOPE)
    assert b.losses(SCOPE) == 0 and b.lost(SCOPE) == 0


def test_the_three_trials_are_configurations_of_it() -> None:
    probe = probe_backoff(32, 8192)  # per (scope, arm), in steps of the scope
    assert [probe.lost(SCOPE, ("ar", 1)) for _ in range(3)] == [32, 64, 128]
    assert probe.allowed(SCOPE, ("spec", 8))
    opening = opening_backoff()  # per scope, in chances to open: two free losses
    assert [opening.lost(SCOPE) for _ in range(4)] == [0, 0, 1, 2]
    assert [opening.ask(SCOPE) for _ in range(3)] == [False, False, True]
    steps = 0
    retry = retry_backoff(lambda: steps)  # per span, in steps of the request
    assert retry.lost("text") == RETRY_FIRST  # the request's own verdict for AR
    steps = RETRY_FIRST - 1
    assert not retry.allowed("text")
    steps = RETRY_FIRST
    assert retry.allowed("text") and retry.waited("text") == RETRY_FIRST
    assert retry.lost("text") == 2 * RETRY_FIRST
    assert max(retry.lost("text") for _ in range(10)) == RETRY_MAX


def test_step_reads_are_read_once_per_step_and_learn_before_a_fresh_read() -> None:
    est = Estimates(clock=lambda: 1.0)
    policy = PolicyConfig().for_model("m")
    reads = StepReads(est, policy, "m", "chat.think-off.user.lt1k")
    reads.begin_prepare(300)
    assert not reads.throughput(("ar", 1), "text").known
    # A step is queued, not yet in the estimates ...
    reads.observe(ar_record(0, 0.004), "text", 0.004, ("ar", 1), False)
    assert not est.ar_s and reads.steps == {("text", "ar"): 1}
    # ... and added before the next step's first read.
    assert reads.throughput(("ar", 1), "text").known and est.ar_s
    reads.keep_prepared()
    reads.observe(spec_record(1, 8, 5, 0.01), "text", 0.01, ("spec", 8), False)
    reads.use_prepared()  # the prepared reads stand in for this step's
    assert reads.estimate(("ar", 1), "text")[0].samples == 1.0
    assert reads.take_ticks() == {"text": 2} and reads.take_ticks() == {}


def _reads() -> StepReads:
    reads = StepReads(Estimates(clock=lambda: 1.0), PolicyConfig().for_model("m"), "m", "c")
    reads.begin_prepare(300)
    return reads


def _bound_after(spec: CycleRecord, seconds: float) -> Throughput | None:
    """Spec 8's bound once AR ran 4 ms a token and one cycle of 8 ran as `spec`."""
    reads = _reads()
    for i in range(4):
        reads.observe(ar_record(i, 0.004), "text", 0.004, ("ar", 1), False)
    reads.observe(spec, "text", seconds, ("spec", 8), False)
    return reads.spec_bound(8, "text")


def test_spec_bound_is_the_lower_of_tau_times_ar_and_a_whole_block_per_cycle() -> None:
    assert _reads().spec_bound(8, "text") is None  # nothing measured: may win
    # A dear cycle (a quantized target on a CPU): 8 tokens per 40 ms at best, under AR's 250.
    dear = _bound_after(spec_record(4, 8, 7, 0.040), 0.040)
    assert dear is not None and abs(dear.tps - 200.0) < 1e-6
    # A cheap cycle that accepts little: tau (here 2) x AR's 250 tok/s bounds it.
    cheap = _bound_after(spec_record(4, 8, 1, 0.005), 0.005)
    assert cheap is not None and abs(cheap.tps - 500.0) < 1e-6
