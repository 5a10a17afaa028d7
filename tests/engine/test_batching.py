"""Continuous batching (`EngineBatcher`): every sequence in a batch gets exactly the events it
gets alone, whichever step it joins or leaves at, in both target families."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest

from toolflash.engine.api import (
    ContextLengthError,
    FinishEvent,
    GenerationRequest,
    Mode,
    SamplingParams,
    TokenEvent,
)
from toolflash.engine.batching.batcher import EngineBatcher, decode_rule, fixed_kind
from toolflash.engine.batching.rows import BatchRows
from toolflash.engine.factory import build_engine

from .model_dirs import write_draft, write_qwen3_target, write_qwen35_target


def small_chunk_engine(family: str, root: Path) -> Any:
    """An engine on a tiny `family` pair written under `root`, with 8-token prefill chunks:
    prompts take several scheduler steps to prefill."""
    write = write_qwen3_target if family == "qwen3" else write_qwen35_target
    config = write(root / "target")
    write_draft(root / "draft", config)
    eng = build_engine(str(root / "target"), str(root / "draft"))
    eng.options = type(eng.options)(**{**eng.options.__dict__, "prefill_chunk": 8})
    return eng


@pytest.fixture(scope="module", params=["qwen3", "qwen35"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return small_chunk_engine(request.param, tmp_path_factory.mktemp(f"models_{request.param}"))


class Run:
    """Tokens, text and finish per key, from a batcher driven step by step."""

    def __init__(self) -> None:
        self.tokens: dict[Hashable, list[int]] = {}
        self.text: dict[Hashable, str] = {}
        self.finish: dict[Hashable, FinishEvent] = {}
        self.errors: dict[Hashable, BaseException] = {}

    def take(self, results: Sequence[tuple[Hashable, Any]]) -> None:
        for key, events in results:
            if isinstance(events, BaseException):
                self.errors[key] = events
                continue
            for event in events:
                if isinstance(event, TokenEvent):
                    self.tokens.setdefault(key, []).extend(event.token_ids)
                    self.text[key] = self.text.get(key, "") + event.text
                else:
                    assert key not in self.finish
                    self.finish[key] = event


def alone(engine: Any, request: GenerationRequest) -> tuple[list[int], str, str]:
    tokens: list[int] = []
    text = ""
    reason = ""
    for event in engine.generate(request):
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
            text += event.text
        else:
            reason = event.finish_reason
    return tokens, text, reason


def drive(
    batcher: EngineBatcher, arrivals: dict[int, list[tuple[Hashable, GenerationRequest]]]
) -> Run:
    """Add requests at the steps named in `arrivals`; step until every one has finished."""
    run = Run()
    step = 0
    pending = sum(len(v) for v in arrivals.values())
    while step <= max(arrivals) or batcher.size:
        for key, request in arrivals.get(step, []):
            batcher.add(key, request)
        run.take(batcher.step())
        step += 1
        assert step < 2000
    assert len(run.finish) + len(run.errors) == pending
    return run


def prompts(engine: Any, n: int) -> list[tuple[int, ...]]:
    texts = ["def add(a, b):", "Hello world, this is", "import os\nimport sys", "x = [1, 2"]
    return [
        tuple(engine.encode(texts[i % 4] + " " * (i // 4) + str(i) * (1 + i % 3))) for i in range(n)
    ]


def test_decode_rule() -> None:
    two = fixed_kind(2)
    assert decode_rule(1, ["spec"], two) == "solo"
    assert decode_rule(2, [], two) == decode_rule(8, ["spec"] * 8, two) == "batched_ar"
    assert decode_rule(2, ["spec", "ar"], two) == "batched_ar"
    assert decode_rule(2, ["spec", "spec"], two) == "batched_spec"
    assert decode_rule(4, ["spec"] * 4, fixed_kind(4)) == "batched_spec"


@pytest.mark.parametrize("offsets", [(0, 0, 0, 0), (0, 1, 3, 7), (0, 5, 2, 11)])
def test_batched_greedy_equals_alone(engine: Any, offsets: tuple[int, ...]) -> None:
    """Joining at every step position (mid-prefill, mid-decode, mid-spec), leaving at
    different lengths: each sequence's tokens and text are those it produces alone."""
    batcher = EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=2)
    reqs = [
        GenerationRequest(p, 12 + 7 * i, mode="spec" if i % 2 == 0 else "ar")
        for i, p in enumerate(prompts(engine, len(offsets)))
    ]
    arrivals: dict[int, list[tuple[Hashable, GenerationRequest]]] = {}
    for i, (off, req) in enumerate(zip(offsets, reqs)):
        arrivals.setdefault(off, []).append((i, req))
    run = drive(batcher, arrivals)
    assert not run.errors
    for i, req in enumerate(reqs):
        tokens, text, reason = alone(engine, req)
        assert run.tokens[i] == tokens, i
        assert run.text[i] == text
        assert run.finish[i].finish_reason == reason
        assert run.finish[i].stats.completion_tokens == len(tokens)
    # The longest request ran alone at its end, the others beside it in batched AR steps.
    bands = [run.finish[i].stats.batch_band for i in range(len(reqs))]
    assert "1" not in bands[:-1] and bands[0] in ("2-3", "4-7")
    assert batcher.rows.size == 0 and batcher.rows.layers is None


@pytest.mark.parametrize("offsets", [(0, 0, 0), (0, 2, 9)])
def test_batched_spec_equals_alone(engine: Any, offsets: tuple[int, ...]) -> None:
    """Every row in spec mode: one batched verify per step, each row keeping its own accepted
    prefix (K/V rolled per row, GatedDeltaNet state per row); outputs as alone."""
    batcher = EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=8)
    reqs = [
        GenerationRequest(p, 30 + 9 * i, mode="spec", ignore_eos=True, block_size=4 + 4 * i)
        for i, p in enumerate(prompts(engine, len(offsets)))
    ]
    arrivals: dict[int, list[tuple[Hashable, GenerationRequest]]] = {}
    for i, (off, req) in enumerate(zip(offsets, reqs)):
        arrivals.setdefault(off, []).append((i, req))
    run = drive(batcher, arrivals)
    assert not run.errors
    for i, req in enumerate(reqs):
        tokens, text, _ = alone(engine, req)
        assert run.tokens[i] == tokens, i
        assert run.text[i] == text
    batched = [c for i in range(len(reqs)) for c in run.finish[i].stats.cycles if c.rows > 1]
    assert sum(c.mode == "spec" for c in batched) > len(batched) // 2


def oracle(reference: list[int], prompt_len: int, wrong_at: int) -> Any:
    """A proposer that drafts the request's own greedy output (known from running it alone),
    wrong at the `wrong_at`-th draft position of every other cycle: rows accept different
    lengths, so the batch keeps a different prefix per row."""
    import mlx.core as mx

    def propose(session: Any, block: int) -> Any:
        done = len(session.tokens) - prompt_len
        ids = [reference[min(done + k, len(reference) - 1)] for k in range(block - 1)]
        if session.cycles % 2 and wrong_at < len(ids):
            ids[wrong_at] = (ids[wrong_at] + 1) % session.target.vocab_size
        logits = mx.full((1, block - 1, session.target.vocab_size), -10.0)
        return logits.at[0, mx.arange(block - 1), mx.array(ids)].add(20.0)

    return propose


def test_batched_spec_keeps_each_rows_accepted_prefix(engine: Any) -> None:
    batcher = EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=8)
    reqs = [
        GenerationRequest(p, 40, mode="spec", ignore_eos=True, block_size=8)
        for p in prompts(engine, 3)
    ]
    refs = [alone(engine, r)[0] for r in reqs]
    for i, req in enumerate(reqs):
        batcher.add(i, req)
        session = batcher.prefilling[-1].lane.session
        session.proposer = oracle(refs[i], len(req.prompt_tokens), 1 + 2 * i)
    run = Run()
    while batcher.size:
        run.take(batcher.step())
    for i in range(3):
        assert run.tokens[i] == refs[i], i
    cycles = [c for i in range(3) for c in run.finish[i].stats.cycles if c.rows > 1]
    accepted = {c.accepted for c in cycles if c.mode == "spec"}
    assert len(accepted) >= 3  # rows kept different prefixes in the same steps


def test_cancel_one_sequence_mid_batch(engine: Any) -> None:
    batcher = EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=2)
    ps = prompts(engine, 3)
    cancel = threading.Event()
    reqs = [GenerationRequest(p, 40, mode="ar", ignore_eos=True) for p in ps]
    batcher.add(0, reqs[0])
    batcher.add(1, reqs[1], cancel)
    batcher.add(2, reqs[2])
    run = Run()
    steps = 0
    while batcher.size:
        run.take(batcher.step())
        steps += 1
        if len(run.tokens.get(1, [])) == 6:
            cancel.set()
    assert run.finish[1].finish_reason == "cancelled"
    assert 6 <= len(run.tokens[1]) <= 7
    for i in (0, 2):
        assert run.tokens[i] == alone(engine, reqs[i])[0]
        assert run.finish[i].finish_reason == "length"


def test_stop_inside_one_sequence_while_others_continue(engine: Any) -> None:
    ps = prompts(engine, 3)
    full = alone(engine, GenerationRequest(ps[1], 30, mode="ar", ignore_eos=True))[1]
    stop = full[8:11]
    reqs = [
        GenerationRequest(ps[0], 30, mode="ar", ignore_eos=True),
        GenerationRequest(ps[1], 30, mode="ar", ignore_eos=True, stop_strings=(stop,)),
        GenerationRequest(ps[2], 30, mode="spec", ignore_eos=True),
    ]
    run = drive(
        EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=2),
        {0: [(i, r) for i, r in enumerate(reqs)]},
    )
    assert run.text[1] == full[: full.find(stop)]
    assert run.finish[1].finish_reason == "stop"
    for i in (0, 2):
        assert run.tokens[i] == alone(engine, reqs[i])[0]


def test_sampled_and_logprobs_per_sequence(engine: Any) -> None:
    ps = prompts(engine, 3)
    sampled = SamplingParams(temperature=0.9, seed=7)
    reqs = [
        GenerationRequest(ps[0], 20, mode="ar", sampling=sampled, ignore_eos=True),
        GenerationRequest(ps[1], 20, mode="ar", logprobs=2, ignore_eos=True),
        GenerationRequest(ps[2], 20, mode="ar", ignore_eos=True),
    ]
    run = drive(
        EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=2),
        {0: [(i, r) for i, r in enumerate(reqs)]},
    )
    for i, req in enumerate(reqs):
        assert run.tokens[i] == alone(engine, req)[0], i


def test_refused_request_does_not_disturb_the_batch(engine: Any) -> None:
    batcher = EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=2)
    too_long = GenerationRequest(tuple([5] * (engine.context_length + 1)), 4)
    with pytest.raises(ContextLengthError):
        batcher.add("x", too_long)
    assert batcher.size == 0


def test_memory_budget_admits_waits_and_refuses(engine: Any) -> None:
    from toolflash.engine.batching.memory import sequence_cost

    cost = sequence_cost(engine.target)
    assert cost.per_token > 0
    if engine.target.family == "qwen3_5":
        assert cost.fixed > 0  # GatedDeltaNet state per sequence
    one = cost.bytes_for(300)
    batcher = EngineBatcher(
        engine, queue_ahead=True, prefill_thread=False, memory_limit=one + one // 2
    )
    req = GenerationRequest(prompts(engine, 1)[0], 300 - len(prompts(engine, 1)[0]))
    assert batcher.admission(req) == "now"
    batcher.add("a", req)
    assert batcher.admission(req) == "wait"  # fits once "a" is gone
    huge = GenerationRequest(req.prompt_tokens, 4000)
    assert batcher.admission(huge) == "never"
    run = Run()
    while batcher.size:
        run.take(batcher.step())
    assert batcher.budget.used == 0 and batcher.admission(req) == "now"


def test_prefix_cache_hit_inside_a_batch(engine: Any) -> None:
    ps = prompts(engine, 2)
    first = GenerationRequest(ps[0], 10, mode="ar", ignore_eos=True)
    out = alone(engine, first)[0]  # publishes its prompt + output (all it fed)
    turn = ps[0] + tuple(out[:-1])
    cached = GenerationRequest(turn + (7, 8, 9), 20, mode="spec", ignore_eos=True)
    other = GenerationRequest(ps[1] + (11,) * 30, 20, mode="ar", ignore_eos=True)
    run = drive(
        EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=2),
        {0: [("cached", cached), ("other", other)]},
    )
    assert run.finish["cached"].stats.cached_tokens == len(turn)
    assert run.tokens["cached"] == alone(engine, cached)[0]
    assert run.tokens["other"] == alone(engine, other)[0]


def test_constrained_beside_unconstrained(engine: Any) -> None:
    from toolflash.engine.api import OutputConstraint

    ps = prompts(engine, 3)
    reqs = [
        GenerationRequest(ps[0], 40, constraint=OutputConstraint("json"), mode="spec"),
        GenerationRequest(ps[1], 40, mode="ar", ignore_eos=True),
        GenerationRequest(ps[2], 40, constraint=OutputConstraint("json"), mode="ar"),
    ]
    run = drive(
        EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=2),
        {0: [(i, r) for i, r in enumerate(reqs)]},
    )
    assert not run.errors
    for i, req in enumerate(reqs):
        assert run.tokens[i] == alone(engine, req)[0], i
    assert run.finish[0].stats.constraint is not None


def test_mode_plan_switch_holds_in_a_batch_as_alone(engine: Any) -> None:
    """A scripted switch to AR holds from its cycle on, whichever forward runs the row (the
    batch plans each row's step through the request's own mode control)."""
    ps = prompts(engine, 2)
    plan: dict[int, Mode] = {2: "ar"}
    switched = GenerationRequest(ps[0], 40, "spec", block_size=4, ignore_eos=True, mode_plan=plan)
    other = GenerationRequest(ps[1], 40, mode="spec", block_size=4, ignore_eos=True)
    batcher = EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=8)
    run = drive(batcher, {0: [(0, switched), (1, other)]})
    assert not run.errors
    assert run.tokens[0] == alone(engine, switched)[0]
    modes = [c.mode for c in run.finish[0].stats.cycles]
    assert modes[:2] == ["spec", "spec"] and set(modes[2:]) == {"ar"} and len(modes) > 4
    assert any(c.rows == 2 for c in run.finish[0].stats.cycles[2:])


def test_batched_ar_steps_queue_the_next_forward(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batched AR step queues the next one's forward on its lazy choices (as an AR step
    alone does), so in steady state no step computes its own forward; rows ending at
    different lengths take the queued forward back, and every row's tokens are those it
    produces alone."""
    kinds: list[str] = []
    forward = BatchRows.forward

    def recorded(self: BatchRows, *args: Any, keep_tape: bool = False, **kwargs: Any) -> Any:
        kinds.append("queued" if keep_tape else "in step")
        return forward(self, *args, keep_tape=keep_tape, **kwargs)

    monkeypatch.setattr(BatchRows, "forward", recorded)
    reqs = [
        GenerationRequest(p, 20 + 9 * i, mode="ar", ignore_eos=True)
        for i, p in enumerate(prompts(engine, 3))
    ]
    batcher = EngineBatcher(engine, queue_ahead=True, prefill_thread=False, spec_rows=2)
    run = drive(batcher, {0: [(i, r) for i, r in enumerate(reqs)]})
    assert not run.errors
    # In the step: the first batched step, and the first after each of two rows ended.
    assert kinds.count("in step") <= 3 and kinds.count("queued") >= 20
    assert batcher.rows.layers is None
    for i, req in enumerate(reqs):
        assert run.tokens[i] == alone(engine, req)[0], i
