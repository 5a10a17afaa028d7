"""Lossless speculative decoding, rollback and stops on tiny random-weight Qwen3 and hybrid
targets."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import pytest

from toolflash.engine.api import Mode
from toolflash.engine.draft_context import DraftWindow
from toolflash.engine.session import GenerationSession
from toolflash.engine.stops import StopMatcher
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target

from .tiny_models import VOCAB, drafter_for, qwen3_target, qwen35_target

PROMPT = [3, 17, 42, 99, 7, 7, 250, 12, 64, 5, 88, 31]
N_OUT = 256

FAMILIES = {
    "qwen3": (qwen3_target, Qwen3Target),
    "qwen3_5": (qwen35_target, Qwen35Target),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: Any) -> tuple[str, Any, Any, list[int]]:
    make, adapter_cls = FAMILIES[request.param]
    model = make()
    drafter = drafter_for(model)
    reference = run(adapter_cls(model), drafter, lambda i: "ar")
    return request.param, model, adapter_cls, reference


def never(_: Sequence[int]) -> int | None:
    return None


def run(
    target: Any,
    drafter: Any,
    mode_at: Callable[[int], Mode],
    proposer: Any = None,
    n_out: int = N_OUT,
    block_size: int = 8,
    window: DraftWindow | None = None,
) -> list[int]:
    session = GenerationSession(target, drafter, proposer=proposer, window=window)
    session.prefill(PROMPT)
    cycle = 0
    while len(session.tokens) < len(PROMPT) + n_out:
        session.step(mode_at(cycle), block_size, never)
        cycle += 1
    return session.tokens[: len(PROMPT) + n_out]


def one_hot_logits(tokens: Sequence[int]) -> mx.array:
    """Drafter logits [1, n, VOCAB] whose argmax is `tokens`."""
    return mx.where(mx.arange(VOCAB)[None] == mx.array(tokens)[:, None], 10.0, 0.0)[None]


def oracle(reference: list[int], p_wrong: float, seed: int = 0) -> Any:
    """Proposes the true continuation with random corruptions: partial acceptance at
    arbitrary positions, which a random drafter never produces."""
    rng = random.Random(seed)

    def propose(session: GenerationSession, block_size: int) -> mx.array:
        start = len(session.tokens)
        out = []
        for i in range(block_size - 1):
            tok = reference[start + i] if start + i < len(reference) else 0
            out.append((tok + 1) % VOCAB if rng.random() < p_wrong else tok)
        return one_hot_logits(out)

    return propose


def test_reference_is_not_degenerate(family: Any) -> None:
    _, _, _, reference = family
    assert len(set(reference[len(PROMPT) :])) > 40


def test_spec_with_random_drafter_equals_ar(family: Any) -> None:
    _, model, adapter_cls, reference = family
    assert run(adapter_cls(model), drafter_for(model), lambda i: "spec") == reference


@pytest.mark.parametrize("p_wrong", [0.05, 0.25])
def test_spec_with_partial_acceptance_equals_ar(family: Any, p_wrong: float) -> None:
    _, model, adapter_cls, reference = family
    propose = oracle(reference + [0] * 32, p_wrong)
    out = run(adapter_cls(model), drafter_for(model), lambda i: "spec", proposer=propose)
    assert out == reference


def test_mode_switches_are_lossless(family: Any) -> None:
    _, model, adapter_cls, reference = family
    rng = random.Random(7)
    plan = [rng.choice(["spec", "ar"]) for _ in range(N_OUT)]
    propose = oracle(reference + [0] * 32, 0.2, seed=3)
    out = run(adapter_cls(model), drafter_for(model), lambda i: plan[i], proposer=propose)  # type: ignore[return-value]
    assert out == reference


def test_small_draft_window_stays_lossless(family: Any) -> None:
    _, model, adapter_cls, reference = family
    out = run(
        adapter_cls(model),
        drafter_for(model),
        lambda i: "spec",
        window=DraftWindow(sink=4, window=16),
    )
    assert out == reference


def _cache_state(cache: list[Any]) -> list[mx.array]:
    out = []
    for c in cache:
        if hasattr(c, "offset"):
            k, v = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
            out += [k, v]
        else:
            out += [c[0], c[1]]
    return out


@pytest.mark.parametrize("keep", [1, 3, 8])
def test_rollback_equals_ar_state(family: Any, keep: int) -> None:
    _, model, adapter_cls, reference = family
    target = adapter_cls(model)
    block = reference[len(PROMPT) : len(PROMPT) + 8]

    rolled = target.make_cache()
    target.forward(mx.array([PROMPT]), rolled)
    res = target.forward(mx.array([block]), rolled, keep_tape=True)
    target.rollback(rolled, res, keep)

    stepped = target.make_cache()
    target.forward(mx.array([PROMPT]), stepped)
    for tok in block[:keep]:
        target.forward(mx.array([[tok]]), stepped)

    for a, b in zip(_cache_state(rolled), _cache_state(stepped), strict=True):
        assert a.shape == b.shape
        assert mx.allclose(a, b, atol=1e-5).item()
    # And the next step from the rolled-back cache matches.
    nxt = mx.array([[block[keep % len(block)]]])
    la = target.forward(nxt, rolled).logits
    lb = target.forward(nxt, stepped).logits
    assert mx.allclose(la, lb, atol=1e-4).item()


def _decode(tokens: Sequence[int]) -> str:
    return "".join(chr(65 + t % 26) for t in tokens)


def _generate_with_stops(model: Any, adapter_cls: Any, matcher: StopMatcher, propose: Any) -> Any:
    session = GenerationSession(adapter_cls(model), drafter_for(model), proposer=propose)
    first = session.prefill(PROMPT)
    end = matcher.check([first])
    while end is None:
        step = session.step("spec", 8, matcher.check)
        if step.finished:
            break
    return session


def test_eos_inside_accepted_block_stops_exactly(family: Any) -> None:
    _, model, adapter_cls, reference = family
    out = reference[len(PROMPT) :]
    eos = out[21]  # lands inside a fully accepted block of 8
    stop_at = out.index(eos)
    matcher = StopMatcher(frozenset({eos}), (), 1000, _decode)
    session = _generate_with_stops(model, adapter_cls, matcher, oracle(reference + [0] * 32, 0.0))
    assert session.tokens[len(PROMPT) :] == out[: stop_at + 1]
    assert matcher.reason == "stop"
    # Nothing after the stop token is in the target cache: it holds everything but the last.
    assert session.fed == len(session.tokens) - 1
    assert session.cache[-1].offset == session.fed or session.cache[1].offset == session.fed


def test_max_tokens_inside_block(family: Any) -> None:
    _, model, adapter_cls, reference = family
    matcher = StopMatcher(frozenset(), (), 13, _decode)
    session = _generate_with_stops(model, adapter_cls, matcher, oracle(reference + [0] * 32, 0.0))
    assert session.tokens[len(PROMPT) :] == reference[len(PROMPT) : len(PROMPT) + 13]
    assert matcher.reason == "length"
    assert session.fed == len(session.tokens) - 1


def test_stop_string_spanning_two_tokens(family: Any) -> None:
    _, model, adapter_cls, reference = family
    out = reference[len(PROMPT) :]
    stop = _decode(out[17:19])  # two characters from two consecutive tokens
    first_hit = _decode(out).find(stop)
    matcher = StopMatcher(frozenset(), (stop,), 1000, _decode)
    session = _generate_with_stops(model, adapter_cls, matcher, oracle(reference + [0] * 32, 0.0))
    # Generation ends at the token completing the stop string's first occurrence.
    assert session.tokens[len(PROMPT) :] == out[: first_hit + 2]
    assert session.fed == len(session.tokens) - 1
