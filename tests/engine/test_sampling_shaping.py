"""Distribution shaping and the penalty/bias processors against the NumPy reference."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from toolflash.engine.api import SamplingParams
from toolflash.engine.sampling import (
    BiasProcessor,
    PenaltyProcessor,
    Shaping,
    sampling_processors,
    shape_logprobs,
)
from toolflash.engine.sampling.shaping import sample

from .sampling_reference import reference_probs
from .stats import ALPHA, chi_square

SETTINGS = [
    {"temperature": 1.0},
    {"temperature": 0.6},
    {"temperature": 1.0, "top_k": 5},
    {"temperature": 0.8, "top_p": 0.7},
    {"temperature": 1.2, "min_p": 0.1},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.95, "min_p": 0.05},
    {"temperature": 2.0, "top_p": 0.01},  # keeps the argmax alone
    {"temperature": 1.0, "top_p": 0.0},  # so does top_p 0
]


@pytest.mark.parametrize("kw", SETTINGS)
def test_shaping_matches_reference(kw: dict) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (4, 64)).astype(np.float32)
    params = SamplingParams(**kw)
    got = np.exp(np.array(shape_logprobs(mx.array(logits), Shaping.of(params))))
    for row in range(4):
        want = reference_probs(logits[row], **kw)
        np.testing.assert_allclose(got[row], want, atol=1e-5)
        assert ((got[row] > 0) == (want > 0)).all()


def test_penalty_rows_see_the_draft_prefix() -> None:
    """Row i of a verify block is penalised for committed output + draft[:i], like the AR step
    at that position."""
    vocab = 16
    proc = PenaltyProcessor(vocab, frequency=0.5, presence=1.0)
    proc.commit([3, 3, 7])
    logits = np.random.default_rng(1).normal(size=(4, vocab)).astype(np.float32)
    draft = [7, 9, 3]
    rows, allowed = proc.process(mx.array(logits), draft)
    assert allowed == 3
    for i in range(4):
        out = [3, 3, 7, *draft[:i]]
        counts = np.bincount(out, minlength=vocab)
        want = logits[i] - 0.5 * counts - 1.0 * (counts > 0)
        np.testing.assert_allclose(np.array(rows[i]), want, atol=1e-6)
    # the drafter's rows only know the committed output
    adjusted = np.array(proc.adjust_proposal(mx.array(logits)))
    counts = np.bincount([3, 3, 7], minlength=vocab)
    np.testing.assert_allclose(adjusted, logits - 0.5 * counts - 1.0 * (counts > 0), atol=1e-6)


def test_bias_is_added_to_every_row() -> None:
    proc = BiasProcessor(8, {2: 5.0, 6: -100.0})
    rows, allowed = proc.process(mx.zeros((3, 8)), [1, 2])
    assert allowed == 2
    assert np.array(rows)[:, 2].tolist() == [5.0] * 3
    assert np.array(rows)[:, 6].tolist() == [-100.0] * 3


def test_plain_requests_get_no_processors() -> None:
    assert sampling_processors(SamplingParams(temperature=0.7, top_p=0.9), 32) == []
    kinds = [
        type(p)
        for p in sampling_processors(SamplingParams(presence_penalty=0.1, logit_bias={1: 1.0}), 32)
    ]
    assert kinds == [PenaltyProcessor, BiasProcessor]


def test_inverse_cdf_draws_follow_the_weights_and_skip_zeros() -> None:
    w = np.array([0.0, 1.0, 0.0, 3.0, 0.5, 0.0], dtype=np.float32)
    n = 40_000
    tokens = np.array(sample(mx.broadcast_to(mx.array(w), (n, len(w))), mx.random.key(3)))
    counts = np.bincount(tokens, minlength=len(w))
    assert counts[w == 0].sum() == 0
    pval, _ = chi_square(counts, w / w.sum())
    assert pval > ALPHA
