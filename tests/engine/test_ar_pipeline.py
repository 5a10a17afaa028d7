"""Pipelined AR (the next step's forward queued before this token is read) against plain AR:
the same tokens, the same stops, lossless switches to speculation and back, and a cache
that afterwards holds exactly what plain AR leaves (no queued token left in it)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from toolflash.cache.state import export_cache
from toolflash.engine.api import GenerationRequest, Mode, SamplingParams
from toolflash.engine.choosers import GreedyChooser, SamplingChooser
from toolflash.engine.service import DFlashEngine
from toolflash.engine.session import GenerationSession
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target

from .tiny_models import drafter_for, qwen3_target, qwen35_target

PROMPT = [3, 17, 42, 99, 7, 7, 250, 12, 64, 5, 88, 31]
N_OUT = 48
FAMILIES = {"qwen3": (qwen3_target, Qwen3Target), "qwen3_5": (qwen35_target, Qwen35Target)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request: Any) -> tuple[Any, Any]:
    make, adapter_cls = FAMILIES[request.param]
    model = make()
    return adapter_cls(model), drafter_for(model)


def never(_: Sequence[int]) -> int | None:
    return None


def stop_after(n: int) -> Any:
    """A stop check that ends the generation at the n-th output token (counting the first)."""
    seen = [1]  # the prefill's token

    def check(tokens: Sequence[int]) -> int | None:
        for j in range(len(tokens)):
            seen[0] += 1
            if seen[0] == n:
                return j
        return None

    return check


def decode(
    target: Any,
    drafter: Any,
    plan: Sequence[Mode],
    lookahead: bool,
    stop: Any = never,
    chooser: Any = None,
) -> GenerationSession:
    """Run `plan` (one mode per step) from a fresh session; AR steps queue ahead when told."""
    session = GenerationSession(target, drafter, chooser=chooser)
    session.prefill(PROMPT)
    for i, mode in enumerate(plan):
        nxt = plan[i + 1] if i + 1 < len(plan) else None
        step = session.step(mode, 8, stop, lookahead=lookahead and nxt == "ar")
        if step.finished:
            break
    session.drain()
    return session


def cache_arrays(session: GenerationSession) -> list[np.ndarray]:
    """Every array the target cache holds, trimmed to the tokens it covers."""
    out = []
    for layer in export_cache(session.cache):
        for a in layer.arrays:
            if a is not None:
                out.append(np.array(a))
    return out


def same_cache(a: GenerationSession, b: GenerationSession) -> bool:
    xs, ys = cache_arrays(a), cache_arrays(b)
    return len(xs) == len(ys) and all(
        x.shape == y.shape and np.allclose(x, y, atol=1e-5) for x, y in zip(xs, ys)
    )


def test_pipelined_ar_equals_plain_ar(pair: Any) -> None:
    target, drafter = pair
    plain = decode(target, drafter, ["ar"] * N_OUT, lookahead=False)
    piped = decode(target, drafter, ["ar"] * N_OUT, lookahead=True)
    assert piped.tokens == plain.tokens
    assert piped.fed == plain.fed == len(plain.tokens) - 1
    assert same_cache(piped, plain)


@pytest.mark.parametrize("stop_at", [2, 3, 9, 17, 30])
def test_stop_at_any_position_leaves_no_queued_token(pair: Any, stop_at: int) -> None:
    target, drafter = pair
    plain = decode(target, drafter, ["ar"] * N_OUT, lookahead=False, stop=stop_after(stop_at))
    piped = decode(target, drafter, ["ar"] * N_OUT, lookahead=True, stop=stop_after(stop_at))
    assert len(piped.tokens) == len(PROMPT) + stop_at
    assert piped.tokens == plain.tokens
    assert piped.fed == plain.fed
    assert same_cache(piped, plain)
    # The exported state (what the prefix cache publishes) covers exactly the fed tokens.
    assert piped.export_state().tokens == tuple(plain.tokens[: plain.fed])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_switches_ar_spec_ar_at_any_step(pair: Any, seed: int) -> None:
    target, drafter = pair
    rng = random.Random(seed)
    plan: list[Mode] = [rng.choice(["ar", "ar", "spec"]) for _ in range(N_OUT)]  # type: ignore[misc]
    reference = decode(target, drafter, ["ar"] * (N_OUT * 8), lookahead=False)
    piped = decode(target, drafter, plan, lookahead=True)
    n = len(piped.tokens)
    assert piped.tokens == reference.tokens[:n]
    plain = decode(target, drafter, plan, lookahead=False)
    assert plain.tokens == piped.tokens
    assert same_cache(piped, plain)


def test_cancel_mid_run_then_resume_from_exported_state(pair: Any) -> None:
    """A consumer that stops after a pipelined step: the state it exports resumes exactly."""
    target, drafter = pair
    reference = decode(target, drafter, ["ar"] * N_OUT, lookahead=False)
    session = GenerationSession(target, drafter)
    session.prefill(PROMPT)
    for _ in range(11):
        session.step("ar", 8, never, lookahead=True)
    state = session.export_state()  # drains the queued forward
    resumed = GenerationSession(target, drafter)
    resumed.prefill(list(session.tokens), restore=state)
    assert state.tokens == tuple(session.tokens[:-1])
    assert resumed.tokens == reference.tokens[: len(session.tokens) + 1]


def test_sampled_pipelined_ar_draws_the_same_tokens(pair: Any) -> None:
    target, drafter = pair
    params = SamplingParams(temperature=0.8, seed=5)
    plain = decode(target, drafter, ["ar"] * N_OUT, False, chooser=SamplingChooser(params))
    piped = decode(target, drafter, ["ar"] * N_OUT, True, chooser=SamplingChooser(params))
    assert piped.tokens == plain.tokens


def test_engine_generate_pipelined_equals_step_by_step(pair: Any) -> None:
    """Through the engine (which queues ahead in AR), the output equals unpipelined steps."""
    target, drafter = pair

    class _Tok:
        eos_token_ids = ()
        chat_template = ""

        def decode(self, ids: Sequence[int]) -> str:
            return " ".join(map(str, ids))

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [int(t) for t in text.split()]

    engine = DFlashEngine(target, _Tok(), drafter, "m", "d", context_length=4096)
    for max_tokens in (1, 2, 5, 20):
        request = GenerationRequest(prompt_tokens=tuple(PROMPT), max_tokens=max_tokens, mode="ar")
        out = [t for e in engine.generate(request) for t in getattr(e, "token_ids", ())]
        plain = decode(target, drafter, ["ar"] * max_tokens, lookahead=False)
        assert out == plain.tokens[len(PROMPT) : len(PROMPT) + max_tokens]
    mx.clear_cache()


@pytest.mark.parametrize("seed", [0, 1])
def test_prepared_drafts_taken_or_dropped_stay_lossless(pair: Any, seed: int) -> None:
    """Work started early (`prepare`: a draft, or an AR forward) is taken by a step of its kind
    and dropped or undone by anything else: the output stays plain AR's."""
    target, drafter = pair
    rng = random.Random(seed)
    reference = decode(target, drafter, ["ar"] * (N_OUT * 8), lookahead=False)
    session = GenerationSession(target, drafter)
    session.prefill(PROMPT)
    for _ in range(N_OUT):
        mode: Mode = rng.choice(["spec", "spec", "ar"])  # type: ignore[assignment]
        block = rng.choice([4, 8])
        if rng.random() < 0.7:
            session.prepare(rng.choice([mode, "ar", "spec"]), rng.choice([block, 4, 8]))
        session.step(mode, block, never, lookahead=mode == "ar" and rng.random() < 0.5)
    session.drain()
    assert session.tokens == reference.tokens[: len(session.tokens)]


class _FollowsOutput:
    """A processor that follows the output: bans the last committed token, and after every
    7th token fixes the next two to 11, 12 (as a grammar's fixed stretch, which `forced`
    offers)."""

    def __init__(self) -> None:
        self.out: list[int] = []

    @staticmethod
    def _fixed(history: Sequence[int]) -> int | None:
        n = len(history)
        if n and n % 7 == 0:
            return 11
        if n % 7 == 1 and n > 1 and history[-1] == 11:
            return 12
        return None

    def _row(self, row: mx.array, history: Sequence[int]) -> mx.array:
        ids = mx.arange(row.shape[0])
        fixed = self._fixed(history)
        if fixed is not None:
            return mx.where(ids == fixed, row, -1e9)
        return mx.where(ids == history[-1], -1e9, row) if history else row

    def _allows(self, tok: int, history: Sequence[int]) -> bool:
        fixed = self._fixed(history)
        return tok == fixed if fixed is not None else not history or tok != history[-1]

    def process(self, logits: mx.array, draft: Sequence[int]) -> tuple[mx.array, int]:
        history, rows, allowed = list(self.out), [], len(draft)
        for i in range(logits.shape[0]):
            rows.append(self._row(logits[i], history))
            if i < len(draft):
                if allowed == len(draft) and not self._allows(int(draft[i]), history):
                    allowed = i
                history.append(int(draft[i]))
        return mx.stack(rows), allowed

    def commit(self, tokens: Sequence[int]) -> None:
        self.out.extend(int(t) for t in tokens)

    def forced(self, limit: int) -> list[int]:
        return [11, 12][:limit] if self._fixed(self.out) == 11 else []

    def stats(self) -> None:
        return None


def test_a_chooser_that_follows_the_output_pipelines_losslessly(pair: Any) -> None:
    """A greedy chooser with processors chooses on the device with the committed output's
    masks and queues the next forward before reading the token (its choice deferred a step):
    the tokens and the cache equal the host-chosen steps', forced runs included."""
    target, drafter = pair
    plain = decode(
        target, drafter, ["ar"] * N_OUT, False, chooser=GreedyChooser([_FollowsOutput()])
    )
    piped = decode(target, drafter, ["ar"] * N_OUT, True, chooser=GreedyChooser([_FollowsOutput()]))
    assert piped.tokens == plain.tokens and same_cache(piped, plain)
    out = plain.tokens[len(PROMPT) :]
    assert any(out[i : i + 2] == [11, 12] for i in range(len(out) - 1))  # forced runs ran
    session = GenerationSession(target, drafter, chooser=GreedyChooser([_FollowsOutput()]))
    session.prefill(PROMPT)
    session.step("ar", 8, never, lookahead=True)
    ahead = session._ahead
    assert ahead is not None and ahead.choice is None  # queued, its choice deferred


def test_lookup_after_a_deferred_forward_verifies_after_it(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lookup steps with processors that follow the output: a continuation found after a
    forward queued with its choice deferred is fed after that forward (its row chooses the
    first token) instead of the forward being undone; the tokens equal host-chosen AR's."""
    import toolflash.engine.session as session_module

    target, drafter = pair
    plain = decode(
        target, drafter, ["ar"] * N_OUT, False, chooser=GreedyChooser([_FollowsOutput()])
    )
    calls: list[tuple[bool, str]] = []
    verify_after_ahead = session_module.verify_after_ahead

    def spy(session: Any, ahead: Any, *args: Any) -> Any:
        calls.append((ahead.choice is None, args[4] if len(args) > 4 else "lookup"))
        return verify_after_ahead(session, ahead, *args)

    monkeypatch.setattr(session_module, "verify_after_ahead", spy)
    session = GenerationSession(target, drafter, chooser=GreedyChooser([_FollowsOutput()]))
    session.prefill(PROMPT)
    while len(session.tokens) < len(plain.tokens):
        session.step("lookup", 8, never, lookahead=True)
    session.drain()
    assert session.tokens[: len(plain.tokens)] == plain.tokens
    assert (True, "lookup") in calls  # a continuation went after a deferred forward
