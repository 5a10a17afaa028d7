"""The band rule: batched verify or batched AR for rows that all want speculation, chosen per
batch-size band from measured rates; in a batch, either kind gives each row its tokens alone."""

from __future__ import annotations

from typing import Any

import pytest

from toolflash.engine.api import GenerationRequest
from toolflash.engine.batching.band_rule import MIN_STEPS, PROBE_EVERY, BandRule, Rate, pick
from toolflash.engine.batching.batcher import EngineBatcher

from .test_batching import alone, drive, prompts, small_chunk_engine


def rate(tokens: float, seconds: float, steps: int = MIN_STEPS) -> Rate:
    r = Rate()
    for _ in range(steps):
        r.add(int(tokens), seconds)
    return r


def test_each_kind_is_measured_before_the_rates_are_trusted() -> None:
    assert pick(Rate(), Rate(), 0) == "batched_spec"
    assert pick(rate(10, 1), Rate(), MIN_STEPS) == "batched_ar"
    assert pick(rate(10, 1), rate(1, 1, MIN_STEPS - 1), MIN_STEPS) == "batched_ar"


def test_the_faster_kind_runs_and_the_slower_is_probed() -> None:
    fast_verify, slow_ar = rate(40, 1), rate(10, 1)
    kinds = [pick(fast_verify, slow_ar, n) for n in range(2 * PROBE_EVERY)]
    assert kinds.count("batched_ar") == 2 and kinds[PROBE_EVERY - 1] == "batched_ar"
    assert pick(rate(10, 1), rate(40, 1), 5) == "batched_ar"


def test_rates_follow_drift_and_bands_are_apart() -> None:
    rule = BandRule()
    for _ in range(MIN_STEPS):
        rule.record(2, "batched_spec", 30, 0.01)
        rule.record(2, "batched_ar", 2, 0.01)
    assert rule.choose(2) == "batched_spec"
    assert rule.choose(8) == "batched_spec"  # another band: nothing measured there yet
    for _ in range(40):  # verify got slow (say the drafter stopped being accepted)
        rule.record(3, "batched_spec", 2, 0.05)
    assert rule.choose(3) == "batched_ar"
    assert rule.summary()["2-3"]["batched_ar"] == pytest.approx(200.0)


@pytest.fixture(scope="module", params=["qwen3", "qwen35"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return small_chunk_engine(request.param, tmp_path_factory.mktemp(f"models_{request.param}"))


def test_a_learnt_batch_runs_both_kinds_with_the_tokens_alone(engine: Any) -> None:
    """Four spec rows under the band rule (the default): the band tries batched verify and
    batched AR steps, records both, and each row's tokens are those it produces alone."""
    reqs = [
        GenerationRequest(p, 30 + 4 * i, mode="spec", block_size=4, ignore_eos=True)
        for i, p in enumerate(prompts(engine, 4))
    ]
    batcher = EngineBatcher(engine, prefill_thread=False)
    run = drive(batcher, {0: [(i, r) for i, r in enumerate(reqs)]})
    assert not run.errors
    batched = {c.mode for i in range(4) for c in run.finish[i].stats.cycles if c.rows > 1}
    assert batched == {"spec", "ar"}
    assert set(batcher.band_rule.summary()["4-7"]) == {"batched_spec", "batched_ar"}
    for i, req in enumerate(reqs):
        assert run.tokens[i] == alone(engine, req)[0], i
