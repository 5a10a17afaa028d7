"""Grammar-constrained decoding on the shipped tiny pair: outputs follow the grammar, and
constrained speculative decoding (with and without the forced-stretch fast path) commits exactly
the tokens constrained AR decoding commits."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from toolflash.engine.api import GenerationRequest, Mode, OutputConstraint, ToolSpec
from toolflash.engine.choosers import GreedyChooser
from toolflash.engine.constraints import constraint_processors
from toolflash.engine.constraints.grammar import ConstraintError, build_grammar, check_schema
from toolflash.engine.constraints.processor import GrammarProcessor, apply_bitmask
from toolflash.engine.constraints.tokenizer import grammar_tokenizer
from toolflash.engine.factory import build_engine
from toolflash.engine.session import GenerationSession
from toolflash.engine.stops import StopMatcher
from toolflash.gateway.reasoning import ReasoningSplitter
from toolflash.gateway.tool_parsers import CallClosed, get_parser

# Agent-shaped schemas: nested objects, arrays, enums, numbers, optional fields, escapes.
SCHEMAS: dict[str, dict[str, Any]] = {
    "user": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "plan": {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "action": {"enum": ["read", "edit", "run", "search"]},
                        "path": {"type": "string"},
                        "confidence": {"type": "number"},
                    },
                    "required": ["action", "path"],
                    "additionalProperties": False,
                },
            },
            "done": {"type": "boolean"},
        },
        "required": ["steps", "done"],
        "additionalProperties": False,
    },
    "edit": {
        "type": "object",
        "properties": {
            "file": {"type": "string", "pattern": "^[a-z_/]+\\.py$"},
            "old": {"type": "string", "maxLength": 40},
            "new": {"type": "string", "maxLength": 40},
            # Bounded: with an unbounded integer the tiny qwen3 writes digits until max_tokens.
            "line": {"type": ["integer", "null"], "minimum": 1, "maximum": 99999},
        },
        "required": ["file", "old", "new"],
        "additionalProperties": False,
    },
}

PROMPTS = {
    "user": "Give me a JSON object describing a user.",
    "plan": "Return the plan as JSON: which files to read and edit to fix the failing test.",
    "edit": 'Write a JSON edit that replaces print("hi\\n") with a log call in src/app.py.',
}

WEATHER = ToolSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    strict=True,
)
SEARCH = ToolSpec(
    "search_code",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}},
        "required": ["query"],
        "additionalProperties": False,
    },
)


def _openai_tool(t: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": t.name, "parameters": t.parameters}}


@pytest.fixture(scope="module")
def engine() -> Any:
    return build_engine("toolflash-tiny-qwen3")


def decode(
    engine: Any,
    request: GenerationRequest,
    mode: Mode,
    fast_forward: bool = True,
) -> tuple[list[int], GrammarProcessor | None]:
    """Run one generation through a session (as the engine does), keeping the processor."""
    procs = list(constraint_processors(request, engine.tokenizer, fast_forward=fast_forward))
    session = GenerationSession(
        engine.target, engine.drafter, window=engine.options.window, chooser=GreedyChooser(procs)
    )
    stops = StopMatcher(engine.eos_ids, (), request.max_tokens, engine.decode)
    out = [session.prefill(list(request.prompt_tokens))]
    finished = stops.check(out) is not None
    while not finished:
        step = session.step(mode, min(16, stops.remaining), stops.check)
        out += step.tokens
        finished = step.finished
    proc = procs[0] if procs else None
    assert proc is None or isinstance(proc, GrammarProcessor)
    return out, proc


def content_of(engine: Any, tokens: list[int]) -> str:
    text = engine.decode([t for t in tokens if t not in engine.eos_ids])
    splitter = ReasoningSplitter(start_in_reasoning=False)
    parts = splitter.feed(text) + splitter.close()
    return "".join(t for channel, t in parts if channel == "content")


def all_modes_agree(engine: Any, request: GenerationRequest) -> tuple[list[int], GrammarProcessor]:
    ar, _ = decode(engine, request, "ar")
    spec, proc = decode(engine, request, "spec")
    spec_slow, _ = decode(engine, request, "spec", fast_forward=False)
    assert spec == ar, "constrained spec (fast-forward) differs from constrained AR"
    assert spec_slow == ar, "constrained spec (drafter only) differs from constrained AR"
    assert proc is not None
    assert ar[-1] in engine.eos_ids, "the grammar should finish well inside max_tokens"
    return ar, proc


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_outputs_validate_and_spec_equals_ar(engine: Any, name: str) -> None:
    schema = SCHEMAS[name]
    prompt = engine.encode_chat(
        [{"role": "user", "content": PROMPTS[name]}], None, {"enable_thinking": False}
    )
    request = GenerationRequest(
        tuple(prompt), 200, constraint=OutputConstraint("json", schema=schema)
    )
    tokens, proc = all_modes_agree(engine, request)
    value = json.loads(content_of(engine, tokens))
    jsonschema.validate(value, schema)
    assert proc.stats().mask_rows > 0


def test_guided_draft_stays_in_the_grammar_and_rolls_back(engine: Any) -> None:
    gt = grammar_tokenizer(engine.tokenizer)
    constraint = OutputConstraint("json", schema=SCHEMAS["user"])
    proc = GrammarProcessor(gt.matcher(build_grammar(constraint, gt.is_special)), 4096, gt.eos_ids)
    vocab = int(engine.target.vocab_size)
    # The drafter's favourites spell text the schema forbids where it fixes the structure;
    # the grammar's best allowed tokens come second.
    wanted = engine.encode('{"name": "A')
    junk = engine.encode("hello world, this is not json at all")
    logits = np.zeros((len(wanted), vocab), dtype=np.float32)
    for i, tok in enumerate(wanted):
        logits[i, tok] = 1.0
        logits[i, junk[i % len(junk)]] = 5.0
    before = proc.matcher.compute_ff_tokens()
    draft = proc.guide(mx.array(logits))
    assert proc.matcher.compute_ff_tokens() == before  # rolled back to the committed state
    _, allowed = proc.process(mx.array(np.zeros((len(draft) + 1, vocab), np.float32)), draft)
    assert allowed == len(draft) > 0  # every guided token is one the grammar allows
    # Structure is forced to the schema's; inside the string value any text is allowed, so
    # there the drafter's own favourite stands.
    head = engine.encode('{"name": "')
    assert draft[: len(head)] == head and len(draft) == len(wanted)


def test_json_object_with_optional_thinking(engine: Any) -> None:
    prompt = engine.encode_chat([{"role": "user", "content": PROMPTS["user"]}])
    constraint = OutputConstraint("json", reasoning="optional")
    tokens, _ = all_modes_agree(
        engine, GenerationRequest(tuple(prompt), 200, constraint=constraint)
    )
    assert isinstance(json.loads(content_of(engine, tokens)), dict)


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
@pytest.mark.parametrize("choice", ["named", "required"])
def test_forced_tool_call_parses_and_validates(engine: Any, fmt: str, choice: str) -> None:
    tools = (WEATHER, SEARCH)
    messages = [{"role": "user", "content": "Find where the retry logic is implemented."}]
    prompt = engine.encode_chat(
        messages,
        [_openai_tool(t) for t in tools],
        {"enable_thinking": False, "tool_call_format": fmt},
    )
    offered = tools if choice == "required" else (WEATHER,)
    constraint = OutputConstraint(
        "tool_calls", tools=offered, tool_format=fmt, parallel_calls=False
    )
    tokens, _ = all_modes_agree(
        engine, GenerationRequest(tuple(prompt), 200, constraint=constraint)
    )
    schemas = {t.name: t.parameters for t in tools}
    pieces = get_parser(fmt).parse(content_of(engine, tokens), schemas)
    calls = [p for p in pieces if isinstance(p, CallClosed)]
    assert len(calls) == 1 and calls[0].ok, pieces
    assert calls[0].name in {t.name for t in offered}
    jsonschema.validate(json.loads(calls[0].arguments), schemas[calls[0].name])


def test_auto_with_strict_tool_keeps_text_free_and_calls_valid(engine: Any) -> None:
    tools = (WEATHER, SEARCH)
    prompt = engine.encode_chat(
        [{"role": "user", "content": "What's the weather in Paris in celsius?"}],
        [_openai_tool(t) for t in tools],
        {"enable_thinking": False},
    )
    constraint = OutputConstraint("tool_calls", tools=tools, require_call=False)
    tokens, _ = all_modes_agree(
        engine, GenerationRequest(tuple(prompt), 200, constraint=constraint)
    )
    schemas = {t.name: t.parameters for t in tools}
    for p in get_parser("hermes").parse(content_of(engine, tokens), schemas):
        if isinstance(p, CallClosed) and p.name == WEATHER.name:
            assert p.ok
            jsonschema.validate(json.loads(p.arguments), schemas[p.name])


def test_process_cuts_draft_at_forbidden_token_and_rolls_back(engine: Any) -> None:
    gt = grammar_tokenizer(engine.tokenizer)
    constraint = OutputConstraint("json", schema=SCHEMAS["user"])
    proc = GrammarProcessor(gt.matcher(build_grammar(constraint, gt.is_special)), 4096, gt.eos_ids)
    good = engine.encode('{"name": "A')
    bad = engine.encode('{"nope')
    vocab = int(engine.target.vocab_size)
    logits = np.zeros((len(bad) + 1, vocab), dtype=np.float32)
    before = proc.matcher.compute_ff_tokens()
    rows, allowed = proc.process(mx.array(logits), bad)
    assert allowed == 1  # `{"` then `nope` is not a property of the schema
    assert proc.matcher.compute_ff_tokens() == before  # rolled back to the committed state
    row0 = np.array(rows[0])
    assert np.isfinite(row0[good[0]]) and np.isneginf(row0[bad[-1]])
    _, allowed = proc.process(mx.array(logits[: len(good) + 1]), good)
    assert allowed == len(good)
    proc.commit(good)
    assert proc.stats().grammar_rejected == len(bad) - 1
    rows, _ = proc.process(mx.array(logits[:1]), [])
    assert np.isneginf(np.array(rows[0])[min(engine.eos_ids)])  # no EOS mid-string


def test_admissible_counts_the_grammar_allowed_prefix_and_rolls_back(engine: Any) -> None:
    gt = grammar_tokenizer(engine.tokenizer)
    constraint = OutputConstraint("json", schema=SCHEMAS["user"])
    proc = GrammarProcessor(gt.matcher(build_grammar(constraint, gt.is_special)), 4096, gt.eos_ids)
    good = engine.encode('{"name": "A')
    bad = engine.encode('{"nope')
    before = proc.matcher.compute_ff_tokens()
    assert proc.admissible(bad) == 1  # the same cut `process` makes
    assert proc.admissible(good) == len(good)
    assert proc.admissible([]) == 0
    eos = min(engine.eos_ids)
    assert proc.admissible([*good, eos]) == len(good)  # no EOS inside a string
    assert proc.matcher.compute_ff_tokens() == before  # rolled back to the committed state
    chooser = GreedyChooser([proc])
    assert chooser.admissible(bad) == 1 and GreedyChooser().admissible(bad) == len(bad)


def test_apply_bitmask_pads_wider_logits() -> None:
    bitmask = np.zeros((1, 1), dtype=np.int32)
    bitmask[0, 0] = 0b101
    out = np.array(apply_bitmask(mx.zeros((1, 40)), bitmask))
    assert list(np.isfinite(out[0]).nonzero()[0]) == [0, 2]


def test_check_schema_names_the_problem() -> None:
    with pytest.raises(ConstraintError, match="not"):
        check_schema({"type": "object", "properties": {"a": {"not": {"type": "string"}}}})
    with pytest.raises(ConstraintError, match="not a valid JSON schema"):
        check_schema({"type": "strin"})
    with pytest.raises(ConstraintError, match="missing"):
        check_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
    check_schema({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, strict=False)


def test_xml_pattern_on_raw_string_is_refused(engine: Any) -> None:
    gt = grammar_tokenizer(engine.tokenizer)
    tool = ToolSpec(
        "f", {"type": "object", "properties": {"p": {"type": "string", "pattern": "a+"}}}, True
    )
    with pytest.raises(ConstraintError, match="pattern"):
        build_grammar(
            OutputConstraint("tool_calls", tools=(tool,), tool_format="qwen3_coder"), gt.is_special
        )


@pytest.mark.parametrize(
    ("reasoning", "text", "complete"),
    [
        ("none", '{"a": 1}', True),
        ("none", '<think>\nx\n</think>\n\n{"a": 1}', False),
        ("optional", '<think>\nplan: {"a": 2}?\n</think>\n\n{"a": 1}', True),
        ("optional", '{"a": 1}', True),
        ("open", 'still thinking\n</think>\n\n{"a": 1}', True),
        ("open", '{"a": 1}', False),
    ],
)
def test_reasoning_modes(engine: Any, reasoning: str, text: str, complete: bool) -> None:
    gt = grammar_tokenizer(engine.tokenizer)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constraint = OutputConstraint("json", schema=schema, reasoning=reasoning)  # type: ignore[arg-type]
    m = gt.matcher(build_grammar(constraint, gt.is_special))
    ids = engine.encode(text)
    ok = m.try_consume_tokens(ids) == len(ids) and m.is_accepting()
    assert ok == complete


def test_json_answer_or_tool_call_when_tools_are_offered(engine: Any) -> None:
    gt = grammar_tokenizer(engine.tokenizer)
    constraint = OutputConstraint("json", schema=SCHEMAS["user"], tools=(WEATHER,))
    grammar = build_grammar(constraint, gt.is_special)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>'
    bad_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for text, complete in [('{"name": "A", "age": 1}', True), (call, True), (bad_call, False)]:
        m = gt.matcher(grammar)
        ids = engine.encode(text)
        assert (m.try_consume_tokens(ids) == len(ids) and m.is_accepting()) == complete, text


def test_hybrid_pair_constrained_spec_equals_ar() -> None:
    """The Qwen3.5 hybrid (GatedDeltaNet state rolled back by tape) under a grammar."""
    from toolflash.engine.factory import assets_dir

    base = assets_dir()
    hybrid = build_engine(str(base / "qwen35-tiny"), str(base / "qwen35-tiny-dflash"))
    tools = (WEATHER, SEARCH)
    prompt = hybrid.encode_chat(
        [{"role": "user", "content": "Find the retry logic."}],
        [_openai_tool(t) for t in tools],
        {"enable_thinking": False, "tool_call_format": "qwen3_coder"},
    )
    constraint = OutputConstraint("tool_calls", tools=tools, tool_format="qwen3_coder")
    tokens, _ = all_modes_agree(
        hybrid, GenerationRequest(tuple(prompt), 120, constraint=constraint)
    )
    pieces = get_parser("qwen3_coder").parse(
        content_of(hybrid, tokens), {t.name: t.parameters for t in tools}
    )
    assert any(isinstance(p, CallClosed) and p.ok for p in pieces)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generation_stats_carry_the_constraint_figures(engine: Any, temperature: float) -> None:
    """`DFlashEngine.generate` reports the chooser's constraint figures in GenerationStats: AR
    masks one row per fed token, drafts nothing and feeds forced runs in one forward; spec checks
    drafts and forces the call's fixed stretches; an unconstrained request reports None."""
    from toolflash.engine.api import FinishEvent, SamplingParams

    prompt = engine.encode_chat(
        [{"role": "user", "content": "What's the weather in Oslo?"}],
        [_openai_tool(WEATHER)],
        {"enable_thinking": False},
    )
    sampling = SamplingParams(temperature=temperature, seed=7)
    constraint = OutputConstraint("tool_calls", tools=(WEATHER,), parallel_calls=False)
    stats = {}
    for mode in ("ar", "spec"):
        req = GenerationRequest(
            tuple(prompt), 80, mode=mode, sampling=sampling, constraint=constraint
        )
        finish = [e for e in engine.generate(req) if isinstance(e, FinishEvent)][0]
        stats[mode] = finish.stats
    ar = stats["ar"].constraint
    assert ar is not None and ar.drafted == 0
    jumps = [c for c in stats["ar"].cycles if c.forced]
    assert ar.forced_runs == len(jumps) >= 1
    assert ar.forced_tokens == sum(c.forced for c in jumps)
    assert ar.mask_rows == 1 + sum(c.block_size for c in stats["ar"].cycles) and ar.mask_s > 0
    spec = stats["spec"].constraint
    assert spec is not None and spec.forced_runs >= 1
    assert spec.forced_tokens >= len(engine.encode('<tool_call>\n{"name": "get_weather"'))
    assert 0 <= spec.grammar_rejected <= spec.drafted
    assert spec.drafted + spec.forced_tokens <= stats["spec"].drafted
    free = GenerationRequest(tuple(prompt), 8, sampling=sampling)
    finish = [e for e in engine.generate(free) if isinstance(e, FinishEvent)][0]
    assert finish.stats.constraint is None


@pytest.mark.parametrize(
    ("schema", "undeclared_ok"),
    [
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, False),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "additionalProperties": True,
            },
            True,
        ),
        ({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}, False),
    ],
)
def test_tool_grammars_are_strict_unless_the_schema_opens_objects(
    engine: Any, schema: dict[str, Any], undeclared_ok: bool
) -> None:
    """Forced calls and strict tools: only declared properties (an undeclared `body` object
    once ran a forced call into max_tokens), unless the schema allows others explicitly."""
    gt = grammar_tokenizer(engine.tokenizer)
    nested = "properties" in schema["properties"]["a"]
    args = '{"a": {"body": 1}}' if nested else '{"a": 1, "body": {}}'
    for tools in ((ToolSpec("f", schema, False),), (ToolSpec("f", schema, True),)):
        for require in (True, False):
            constraint = OutputConstraint(
                "tool_calls", tools=tools, require_call=require, tool_format="hermes"
            )
            if not require and not tools[0].strict:
                continue  # auto with a non-strict tool: no constraint at all
            m = gt.matcher(build_grammar(constraint, gt.is_special))
            text = '<tool_call>\n{"name": "f", "arguments": ' + args + "}\n</tool_call>"
            ids = engine.encode(text)
            assert (m.try_consume_tokens(ids) == len(ids)) == undeclared_ok, (tools, require)
