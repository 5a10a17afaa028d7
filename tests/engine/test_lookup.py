"""Lookup drafting (engine/lookup.py): the index's proposals, and lookup cycles in the session
against plain AR: the same tokens in every mix of modes, with stops, prepared work, constraints,
no drafter at all, and a state restored from the prefix cache."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import pytest

from toolflash.engine.api import (
    GenerationRequest,
    Mode,
    OutputConstraint,
    SamplingParams,
    ToolSpec,
)
from toolflash.engine.choosers import SamplingChooser
from toolflash.engine.factory import build_engine
from toolflash.engine.lookup import LookupConfig, NgramIndex, takes_over
from toolflash.engine.service import DFlashEngine, EngineOptions
from toolflash.engine.session import GenerationSession, dflash_proposal
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target

from .test_ar_pipeline import never, same_cache, stop_after
from .tiny_models import drafter_for, qwen3_target, qwen35_target

# A prompt that repeats itself, so the output (tiny random targets loop) finds matches.
PROMPT = [3, 17, 42, 99, 7, 250, 12, 64, 5, 88, 31] * 3 + [3, 17]
N_OUT = 48
# Matches from one token on: the tiny random targets copy little, and every hit exercises the
# verify paths (the default's longer minimum is a speed choice, not a correctness one).
LOOKUP = LookupConfig(min_n=1, max_n=4)
FAMILIES = {"qwen3": (qwen3_target, Qwen3Target), "qwen3_5": (qwen35_target, Qwen35Target)}


# -- the index ---------------------------------------------------------------------------------
def test_proposes_the_continuation_of_the_longest_match() -> None:
    index = NgramIndex(LookupConfig(min_n=1, max_n=3))
    #          0  1  2  3  4  5  6  7  8
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3]
    # Suffix [1, 2, 3] occurred at 0..2 (continued by 4); [2, 3] last at 5..6 (continued by 5).
    assert index.propose(tokens, 3) == [4, 9, 2]
    fresh = NgramIndex(LookupConfig(min_n=1, max_n=3))
    assert fresh.propose([*tokens[:-3], 7, 2, 3], 2) == [5, 7]


def test_latest_occurrence_wins_and_the_suffix_never_matches_itself() -> None:
    index = NgramIndex(LookupConfig(min_n=2, max_n=2))
    assert index.propose([5, 6], 4) == []  # only itself
    assert index.propose([5, 6, 1, 5, 6, 2, 5, 6], 4) == [2, 5, 6]
    assert index.propose([5, 6, 1, 5, 6, 2, 5, 6], 1) == [2]
    assert index.propose([5, 6, 1, 5, 6, 2, 5, 6], 0) == []


def test_below_min_n_nothing_is_proposed() -> None:
    index = NgramIndex(LookupConfig(min_n=3, max_n=4))
    assert index.propose([1, 2, 9, 1, 2], 4) == []  # [1, 2] repeats, [9, 1, 2] does not
    assert index.propose([1, 2, 9, 1, 2, 9, 1, 2], 4) == [9, 1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_incremental_index_equals_a_fresh_one(seed: int) -> None:
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(300)]
    grown = NgramIndex()
    for end in range(1, len(tokens) + 1):
        prefix = tokens[:end]
        assert grown.propose(prefix, 5) == NgramIndex().propose(prefix, 5)


def test_a_sequence_that_shrank_is_indexed_afresh() -> None:
    index = NgramIndex(LookupConfig(min_n=1, max_n=2))
    assert index.propose([1, 2, 3, 1], 2) == [2, 3]
    assert index.propose([4, 4], 2) == [4]  # [1, 2, 3]'s entries are gone


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        LookupConfig(min_n=0)
    with pytest.raises(ValueError):
        LookupConfig(min_n=3, max_n=2)


def test_takeover_needs_a_full_block_and_a_drafter_off_its_run() -> None:
    assert takes_over(7, 7, None)  # nothing drafted yet: copy
    assert not takes_over(6, 7, None)  # a copy shorter than the block never takes over
    assert takes_over(7, 7, (3, 7))  # the drafter's last draft: under half accepted
    assert not takes_over(7, 7, (4, 7))  # over half: the drafter is on a run
    assert not takes_over(15, 15, (15, 15))
    assert takes_over(3, 3, (0, 3))


# -- the session -------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request: Any) -> tuple[Any, Any]:
    make, adapter_cls = FAMILIES[request.param]
    model = make()
    return adapter_cls(model), drafter_for(model)


def run(
    target: Any, drafter: Any, plan: Sequence[Mode], stop: Any = never, chooser: Any = None
) -> tuple[GenerationSession, list[Any]]:
    session = GenerationSession(target, drafter, chooser=chooser, lookup=LOOKUP)
    session.prefill(PROMPT)
    records = []
    for mode in plan:
        step = session.step(mode, 8, stop)
        records.append(step.record)
        if step.finished:
            break
    return session, records


def ar_reference(target: Any, drafter: Any, n: int = N_OUT * 8) -> list[int]:
    session, _ = run(target, drafter, ["ar"] * n)
    return session.tokens


def test_greedy_lookup_equals_ar_and_drafts(pair: Any) -> None:
    target, drafter = pair
    reference = ar_reference(target, drafter)
    session, records = run(target, drafter, ["lookup"] * N_OUT)
    assert session.tokens == reference[: len(session.tokens)]
    drafted = [r for r in records if r.drafted > 0]
    assert drafted, "the repeated prompt gave lookup nothing to draft"
    assert all(r.mode == "lookup" for r in records)
    # Misses are AR steps (block 1); hits verify the continuation (block = drafted + 1).
    assert all(r.block_size == r.drafted + 1 for r in records)
    # What lookup leaves in the cache is what AR leaves for the same tokens.
    ar_session, _ = run(target, drafter, ["ar"] * (len(session.tokens) - len(PROMPT) - 1))
    assert ar_session.tokens == session.tokens
    assert same_cache(session, ar_session)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_mix_of_modes_and_prepared_work_stays_ar(pair: Any, seed: int) -> None:
    target, drafter = pair
    rng = random.Random(seed)
    reference = ar_reference(target, drafter)
    session = GenerationSession(target, drafter, lookup=LOOKUP)
    session.prefill(PROMPT)
    for _ in range(N_OUT):
        mode: Mode = rng.choice(["lookup", "lookup", "spec", "ar"])  # type: ignore[assignment]
        block = rng.choice([2, 4, 8])
        if rng.random() < 0.7:
            session.prepare(rng.choice([mode, "ar", "spec", "lookup"]), rng.choice([block, 4]))
        session.step(mode, block, never, lookahead=mode == "ar" and rng.random() < 0.5)
    session.drain()
    assert session.tokens == reference[: len(session.tokens)]


@pytest.mark.parametrize("seed", [0, 1])
def test_lookup_steps_queued_ahead_equal_ar(pair: Any, seed: int) -> None:
    """Lookup steps that queue the next forward ahead (no match) and then verify a match on
    top of it: the output, the fed count and the cache stay plain AR's."""
    target, drafter = pair
    rng = random.Random(seed)
    reference = ar_reference(target, drafter)
    session = GenerationSession(target, drafter, lookup=LOOKUP)
    session.prefill(PROMPT)
    records = []
    for _ in range(N_OUT):
        mode: Mode = rng.choice(["lookup", "lookup", "lookup", "ar", "spec"])  # type: ignore[assignment]
        if rng.random() < 0.5:
            session.prepare(mode, 4)
        step = session.step(mode, rng.choice([2, 4, 8]), never, lookahead=rng.random() < 0.8)
        records.append(step.record)
    session.drain()
    assert session.tokens == reference[: len(session.tokens)]
    assert session.fed == len(session.tokens) - 1
    plain, _ = run(target, drafter, ["ar"] * (len(session.tokens) - len(PROMPT) - 1))
    assert same_cache(session, plain)
    assert any(r.mode == "lookup" and r.drafted for r in records)


@pytest.mark.parametrize("stop_at", [2, 5, 13, 29])
def test_stop_inside_a_lookup_block_keeps_nothing_after_it(pair: Any, stop_at: int) -> None:
    target, drafter = pair
    session, _ = run(target, drafter, ["lookup"] * N_OUT, stop=stop_after(stop_at))
    plain, _ = run(target, drafter, ["ar"] * N_OUT, stop=stop_after(stop_at))
    assert session.tokens == plain.tokens
    assert session.fed == plain.fed
    assert same_cache(session, plain)


def test_spec_takeover_verifies_full_block_copies_without_the_drafter(pair: Any) -> None:
    """The combined proposer: a spec cycle whose lookup continuation fills the block verifies it
    and skips the drafter; the output stays AR's."""
    target, drafter = pair
    reference = ar_reference(target, drafter)
    calls = [0]

    def counting(session: GenerationSession, block: int) -> Any:
        calls[0] += 1
        return dflash_proposal(session, block)

    config = LookupConfig(min_n=1, max_n=4, spec_takeover=True)
    session = GenerationSession(target, drafter, proposer=counting, lookup=config)
    session.prefill(PROMPT)
    records = [session.step("spec", 4, never).record for _ in range(N_OUT)]
    assert session.tokens == reference[: len(session.tokens)]
    assert all(r.mode == "spec" and not r.draft_cut for r in records)
    assert 0 < calls[0] < len(records)  # some cycles copied, some drafted


def test_spec_takeover_leaves_a_drafter_on_a_run_alone(pair: Any) -> None:
    """A drafter that drafts exactly the target's output (every draft accepted) keeps every
    cycle after its first draft, although the repeated prompt gives full-block copies; the
    output stays AR's."""
    target, drafter = pair
    reference = ar_reference(target, drafter)
    vocab = int(target.vocab_size)
    calls: list[int] = []

    def oracle(session: GenerationSession, block: int) -> Any:
        calls.append(session.cycles)
        ahead = reference[len(session.tokens) : len(session.tokens) + block - 1]
        return (mx.eye(vocab)[mx.array(ahead)] * 100.0)[None]

    config = LookupConfig(min_n=1, max_n=4, spec_takeover=True)
    session = GenerationSession(target, drafter, proposer=oracle, lookup=config)
    session.prefill(PROMPT)
    records = [session.step("spec", 4, never).record for _ in range(N_OUT)]
    assert session.tokens == reference[: len(session.tokens)]
    assert calls, "the drafter never ran"
    assert all(r.accepted == r.drafted == 3 for r in records[calls[0] :])
    # From its first draft on, the drafter drafted every cycle: no copy replaced its run.
    assert calls == list(range(calls[0], len(records)))


def test_lookup_needs_no_drafter(pair: Any) -> None:
    target, drafter = pair
    reference = ar_reference(target, drafter)
    session, records = run(target, None, ["lookup"] * N_OUT)
    assert session.tokens == reference[: len(session.tokens)]
    assert any(r.drafted for r in records)


def test_sampled_lookup_is_reproducible_and_verifies_by_rejection(pair: Any) -> None:
    """Sampled lookup verifies a one-hot proposal (rejection sampling): a seed fixes the output."""
    target, drafter = pair
    params = SamplingParams(temperature=0.7, seed=3)
    a, ra = run(target, drafter, ["lookup"] * N_OUT, chooser=SamplingChooser(params))
    b, _ = run(target, drafter, ["lookup"] * N_OUT, chooser=SamplingChooser(params))
    assert a.tokens == b.tokens
    assert all(r.accepted <= r.drafted for r in ra)


def test_resumed_from_an_exported_state_the_index_covers_the_restored_tokens(pair: Any) -> None:
    target, drafter = pair
    reference = ar_reference(target, drafter)
    first, _ = run(target, drafter, ["lookup"] * 10)
    state = first.export_state()
    resumed = GenerationSession(target, drafter, lookup=LOOKUP)
    resumed.prefill(list(first.tokens[:-1]), restore=state)
    records = [resumed.step("lookup", 8, never).record for _ in range(20)]
    assert resumed.tokens == reference[: len(resumed.tokens)]
    assert any(r.drafted for r in records)


# -- through the engine ------------------------------------------------------------------------
class _Tok:
    eos_token_ids = ()
    chat_template = ""

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in text.split()]


@pytest.mark.parametrize("with_drafter", [True, False])
def test_engine_lookup_mode_equals_ar(pair: Any, with_drafter: bool) -> None:
    target, drafter = pair
    engine = DFlashEngine(
        target,
        _Tok(),
        drafter if with_drafter else None,
        "m",
        "d",
        context_length=4096,
        options=EngineOptions(lookup=LOOKUP),
    )

    def out(mode: Mode, **kw: Any) -> tuple[list[int], Any]:
        request = GenerationRequest(prompt_tokens=tuple(PROMPT), max_tokens=40, mode=mode, **kw)
        events = list(engine.generate(request))
        tokens = [t for e in events for t in getattr(e, "token_ids", ())]
        return tokens, events[-1].stats

    ar, _ = out("ar")
    lookup, stats = out("lookup")
    assert lookup == ar
    assert "lookup" in stats.modes and stats.spec_cycles > 0


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


@pytest.mark.parametrize(
    "constraint",
    [
        None,
        OutputConstraint(kind="json", schema=None),
        OutputConstraint(
            kind="tool_calls", tools=(ToolSpec("read_file", TOOLS[0]["function"]["parameters"]),)
        ),
    ],
    ids=["free", "json", "tool_call"],
)
def test_shipped_pair_lookup_equals_ar_under_constraints(constraint: Any) -> None:
    """On the embedded pair with a real tokenizer: a prompt that quotes a file, free and under
    the grammar constraints (forced runs and grammar-cut lookup drafts)."""
    engine = shipped_engine()
    messages = [
        {"role": "user", "content": "Read src/app/main.py then repeat: def main(): return 0"},
        {"role": "assistant", "content": "def main(): return 0"},
        {"role": "user", "content": "Again, and read src/app/main.py with the tool."},
    ]
    prompt = tuple(engine.encode_chat(messages, TOOLS))

    finished: list[Any] = []

    def out(mode: Mode) -> list[int]:
        request = GenerationRequest(
            prompt_tokens=prompt, max_tokens=48, mode=mode, constraint=constraint
        )
        events = list(engine.generate(request))
        finished.append(events[-1].stats)
        return [t for e in events for t in getattr(e, "token_ids", ())]

    assert out("lookup") == out("ar")
    if constraint is not None:
        # Copies are cut at the first token the grammar rejects before the verify: the
        # grammar never has a copied token to reject there.
        assert finished[0].constraint.grammar_rejected == 0


_SHIPPED: list[Any] = []


def shipped_engine() -> Any:
    if not _SHIPPED:
        _SHIPPED.append(build_engine("toolflash-tiny-qwen35"))
    return _SHIPPED[0]
