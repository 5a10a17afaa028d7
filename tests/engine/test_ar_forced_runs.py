"""AR jump-forward: under a grammar, an AR step feeds a forced run in one target forward and
commits exactly what one-token AR steps commit (and what constrained spec commits), on both tiny
families; stops, max_tokens and logprobs inside a run; sampled and penalised decoding; runs the
target refuses; and the cycle records the policy reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from toolflash.cache.state import SessionState
from toolflash.engine.api import (
    ConstraintStats,
    CycleRecord,
    GenerationRequest,
    Mode,
    OutputConstraint,
    SamplingParams,
    ToolSpec,
)
from toolflash.engine.choosers import GreedyChooser, build_chooser
from toolflash.engine.factory import assets_dir, build_engine
from toolflash.engine.sampling.logprobs import RawLogprob
from toolflash.engine.session import GenerationSession
from toolflash.engine.stops import StopMatcher
from toolflash.engine.targets.base import cache_offset

USER = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = ToolSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    strict=True,
)


@pytest.fixture(scope="module")
def qwen3() -> Any:
    return build_engine("toolflash-tiny-qwen3")


@pytest.fixture(scope="module")
def qwen35() -> Any:
    base = assets_dir()
    return build_engine(str(base / "qwen35-tiny"), str(base / "qwen35-tiny-dflash"))


def _request(engine: Any, kind: str, max_tokens: int = 120, **kw: Any) -> GenerationRequest:
    if kind == "json":
        prompt = engine.encode_chat(
            [{"role": "user", "content": "Give me a JSON object describing a user."}],
            None,
            {"enable_thinking": False},
        )
        constraint = OutputConstraint("json", schema=USER)
    else:
        tool = {
            "type": "function",
            "function": {"name": WEATHER.name, "parameters": WEATHER.parameters},
        }
        prompt = engine.encode_chat(
            [{"role": "user", "content": "What's the weather in Oslo?"}],
            [tool],
            {"enable_thinking": False},
        )
        constraint = OutputConstraint(
            "tool_calls", tools=(WEATHER,), tool_format="hermes", parallel_calls=False
        )
    return GenerationRequest(tuple(prompt), max_tokens, constraint=constraint, **kw)


@dataclass
class Run:
    tokens: list[int]  # output tokens (the prefill's first, then each step's)
    records: list[CycleRecord]
    logprobs: list[RawLogprob]
    session: GenerationSession
    stats: ConstraintStats | None


def decode(
    engine: Any,
    request: GenerationRequest,
    mode: Mode,
    jump: bool = True,
    stop_strings: Sequence[str] = (),
) -> Run:
    """One generation through a session, as `DFlashEngine.generate` drives it; `jump` False
    decodes AR one token per step (the behaviour before jump-forward)."""
    chooser = build_chooser(request, engine.target.vocab_size, engine.tokenizer)
    session = GenerationSession(
        engine.target,
        engine.drafter,
        window=engine.options.window,
        chooser=chooser,
        logprobs=request.logprobs,
        ar_forced_limit=15 if jump else 0,
    )
    stops = StopMatcher(
        engine.eos_ids | request.stop_token_ids, stop_strings, request.max_tokens, engine.decode
    )
    out = [session.prefill(list(request.prompt_tokens))]
    logprobs = list(session.first_logprobs)
    records: list[CycleRecord] = []
    finished = stops.check(out) is not None
    while not finished:
        step = session.step(mode, min(16, stops.remaining), stops.check)
        out += step.tokens
        records.append(step.record)
        logprobs += step.logprobs
        finished = step.finished
    return Run(out, records, logprobs, session, chooser.stats())


def _jumped(run: Run) -> list[CycleRecord]:
    return [r for r in run.records if r.mode == "ar" and r.forced > 0]


def assert_same_state(a: SessionState, b: SessionState) -> None:
    """Same fed tokens, and target caches, drafter context and last logits equal up to float
    rounding (a multi-row forward sums in another order than one-row forwards)."""
    assert a.tokens == b.tokens
    pairs = [(a.last_logits, b.last_logits)]
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert la.kind == lb.kind
        pairs += list(zip(la.arrays, lb.arrays, strict=True))
    assert a.draft is not None and b.draft is not None
    assert a.draft.covered == b.draft.covered
    pairs += list(zip(a.draft.keys, b.draft.keys, strict=True))
    pairs += list(zip(a.draft.values, b.draft.values, strict=True))
    for x, y in pairs:
        assert x.shape == y.shape
        np.testing.assert_allclose(np.array(x), np.array(y), rtol=1e-3, atol=1e-3)


def assert_consistent(run: Run) -> None:
    """Every committed token but the staged last one is in the target cache and the drafter
    context; nothing after it."""
    s = run.session
    assert s.fed == len(s.tokens) - 1
    assert cache_offset(s.cache) == s.fed
    assert s.draft_ctx is not None and s.draft_ctx.positions == s.fed


@pytest.mark.parametrize("family", ["qwen3", "qwen35"])
@pytest.mark.parametrize("kind", ["json", "hermes"])
def test_jump_forward_ar_equals_one_step_ar_and_spec(
    request: pytest.FixtureRequest, family: str, kind: str
) -> None:
    engine = request.getfixturevalue(family)
    req = _request(engine, kind)
    jump = decode(engine, req, "ar")
    step = decode(engine, req, "ar", jump=False)
    spec = decode(engine, req, "spec")
    assert jump.tokens == step.tokens == spec.tokens
    assert jump.tokens[-1] in engine.eos_ids, "the grammar should finish inside max_tokens"
    # Forced runs were fed in one forward each, and fewer forwards decoded the same output.
    runs = _jumped(jump)
    assert runs and any(r.forced >= 2 for r in runs)
    assert not _jumped(step) and all(r.committed == 1 for r in step.records)
    assert len(jump.records) < len(step.records)
    assert sum(r.committed for r in jump.records) == sum(r.committed for r in step.records)
    for r in runs:
        assert r.block_size == r.forced + 1 and r.drafted == 0 and r.accepted == 0
        assert 1 <= r.committed <= r.forced + 1
    # One jump per forced run the grammar offered, every offered token fed.
    assert jump.stats is not None
    assert jump.stats.forced_runs == len(runs)
    assert jump.stats.forced_tokens == sum(r.forced for r in runs)
    assert_consistent(jump)
    assert_same_state(jump.session.export_state(), step.session.export_state())


def _inside_a_run(engine: Any, run: Run, by_text: bool) -> tuple[int, int]:
    """(output index, token) of a token a jump step committed before its last token, whose id
    (`by_text`: whose text) does not occur earlier in the output, so a stop on it ends there."""
    out = run.tokens
    pos = 1  # out[0] is the prefill's token
    for r in run.records:
        if r.mode == "ar" and r.forced >= 2 and r.committed >= 3:
            for j in range(pos, pos + r.committed - 1):
                text = engine.decode([out[j]])
                if by_text:
                    fresh = text.strip() != "" and text not in engine.decode(out[:j])
                    # and no shorter prefix of the output ends in it
                    fresh = fresh and text not in engine.decode(out[: j + 1])[:-1]
                else:
                    fresh = out[j] not in out[:j]
                if fresh:
                    return j, out[j]
        pos += r.committed
    raise AssertionError("no forced run to stop inside")


@pytest.mark.parametrize("family", ["qwen3", "qwen35"])
@pytest.mark.parametrize("how", ["stop_id", "stop_string", "max_tokens"])
def test_generation_ending_inside_a_forced_run(
    request: pytest.FixtureRequest, family: str, how: str
) -> None:
    engine = request.getfixturevalue(family)
    full = decode(engine, _request(engine, "hermes"), "ar")
    index, token = _inside_a_run(engine, full, how == "stop_string")
    stop_strings: tuple[str, ...] = ()
    if how == "stop_id":
        req = _request(engine, "hermes", stop_token_ids=frozenset({token}))
    elif how == "max_tokens":
        req = _request(engine, "hermes", max_tokens=index + 1)
    else:
        req = _request(engine, "hermes")
        stop_strings = (engine.decode([token]),)
    jump = decode(engine, req, "ar", stop_strings=stop_strings)
    step = decode(engine, req, "ar", jump=False, stop_strings=stop_strings)
    spec = decode(engine, req, "spec", stop_strings=stop_strings)
    assert jump.tokens == step.tokens == spec.tokens
    assert jump.tokens == full.tokens[: index + 1]
    # The last step was a jump cut short: nothing after the stop is counted or cached.
    assert jump.records[-1].forced >= 2 and jump.records[-1].committed <= jump.records[-1].forced
    assert sum(r.committed for r in jump.records) == len(jump.tokens) - 1
    assert_consistent(jump)
    assert_same_state(jump.session.export_state(), step.session.export_state())


@pytest.mark.parametrize("family", ["qwen3", "qwen35"])
def test_logprobs_inside_forced_runs_equal_one_step_ar(
    request: pytest.FixtureRequest, family: str
) -> None:
    engine = request.getfixturevalue(family)
    req = _request(engine, "json", logprobs=3)
    jump = decode(engine, req, "ar")
    step = decode(engine, req, "ar", jump=False)
    assert jump.tokens == step.tokens and _jumped(jump)
    assert len(jump.logprobs) == len(step.logprobs) == len(jump.tokens)  # output tokens
    for a, b in zip(jump.logprobs, step.logprobs, strict=True):
        assert a.token_id == b.token_id
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        np.testing.assert_allclose([v for _, v in a.top], [v for _, v in b.top], atol=1e-4)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.9, top_p=0.95, seed=3),
        SamplingParams(temperature=1.0, seed=11, frequency_penalty=0.8, presence_penalty=0.3),
        SamplingParams(frequency_penalty=1.5, logit_bias={100: 2.0}),  # greedy, penalised
    ],
)
def test_sampled_and_penalised_jump_forward_equals_one_step_ar(
    qwen3: Any, sampling: SamplingParams
) -> None:
    """Row i of a jump is drawn with the key and processed history of AR's step i, so a seeded
    sampled request (and any penalised one) decodes token for token as one-token AR."""
    for kind in ("json", "hermes"):
        req = _request(qwen3, kind, sampling=sampling)
        jump = decode(qwen3, req, "ar")
        step = decode(qwen3, req, "ar", jump=False)
        assert jump.tokens == step.tokens, kind
        assert _jumped(jump)


class Suggests:
    """Offers `token` as a forced run of `n` at every position but allows every token: the
    target decides, and AR must come out exactly as without the suggestion."""

    def __init__(self, token: int, n: int = 3) -> None:
        self.token, self.n = token, n

    def process(self, logits: mx.array, draft: Sequence[int]) -> tuple[mx.array, int]:
        return logits, len(draft)

    def commit(self, tokens: Sequence[int]) -> None:
        return None

    def forced(self, limit: int) -> list[int]:
        return [self.token] * min(self.n, limit)

    def stats(self) -> ConstraintStats | None:
        return None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_forced_run_the_target_refuses_changes_nothing(qwen3: Any, temperature: float) -> None:
    from toolflash.engine.choosers import SamplingChooser

    prompt = qwen3.encode("def add(a, b):")
    # A token the target sometimes takes: the commonest in its own greedy output.
    plain_out = decode(qwen3, GenerationRequest(tuple(prompt), 40), "ar").tokens
    first = max(set(plain_out), key=plain_out.count)

    def run(jump: bool) -> tuple[list[int], list[CycleRecord]]:
        params = SamplingParams(temperature=temperature, seed=5)
        procs = [Suggests(first)]
        chooser = GreedyChooser(procs) if params.greedy else SamplingChooser(params, procs)
        s = GenerationSession(qwen3.target, qwen3.drafter, chooser=chooser)
        s.ar_forced_limit = 15 if jump else 0
        out = [s.prefill(prompt)]
        records = []
        while len(out) < 40:
            step = s.step("ar", 16, lambda _: None)
            out += step.tokens
            records.append(step.record)
        return out[:40], records

    jumped, records = run(True)
    plain, _ = run(False)
    assert jumped == plain
    # Suggestions refused at the first row commit one token, as a plain step would; some
    # were taken for a row or more.
    assert all(r.forced == 3 for r in records)
    assert any(r.committed == 1 for r in records)
    if temperature == 0.0:
        assert any(r.committed >= 2 for r in records)
