"""Cycle records say which cycles were grammar-forced runs (no drafter run, the stretch verified in
one forward) and which drafts the grammar cut short, so the adaptive policy can credit them apart
from full drafted cycles."""

from __future__ import annotations

from typing import Any

import pytest

from toolflash.engine.api import FinishEvent, GenerationRequest, Mode, OutputConstraint, ToolSpec
from toolflash.engine.factory import build_engine

TOOL = ToolSpec(
    "read_file",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


@pytest.fixture(scope="module")
def engine() -> Any:
    return build_engine("toolflash-tiny-qwen3")


def _stats(engine: Any, mode: Mode, constraint: OutputConstraint | None) -> Any:
    prompt = engine.encode_chat(
        [{"role": "user", "content": "Read src/utils.py for me."}],
        [{"type": "function", "function": {"name": TOOL.name, "parameters": TOOL.parameters}}],
        {"enable_thinking": False},
    )
    # Room for the whole call: no cycle is shortened by max_tokens.
    req = GenerationRequest(
        tuple(prompt), 200, mode=mode, block_size=16, draft_length="fixed", constraint=constraint
    )
    return [e for e in engine.generate(req) if isinstance(e, FinishEvent)][0].stats


def test_forced_cycles_are_marked_and_match_the_constraint_figures(engine: Any) -> None:
    constraint = OutputConstraint("tool_calls", tools=(TOOL,), parallel_calls=False)
    spec = _stats(engine, "spec", constraint)
    forced = [c for c in spec.cycles if c.forced]
    assert spec.constraint is not None and spec.constraint.forced_runs >= 1
    # One forced cycle per forced run, every proposal token of it forced.
    assert len(forced) == spec.constraint.forced_runs
    assert sum(c.forced for c in forced) == spec.constraint.forced_tokens
    for c in forced:
        assert c.mode == "spec" and c.drafted == c.forced and c.block_size == c.forced + 1
    # Drafted cycles ran the drafter and carry no forced tokens.
    assert any(c.forced == 0 and c.drafted > 0 for c in spec.cycles)
    # With fixed blocks of 16, a drafted cycle shorter than the block was cut by the grammar, and
    # says so.
    for c in spec.cycles:
        assert c.draft_cut == (c.forced == 0 and c.block_size < 16)
    # AR takes the same forced runs (jump-forward): one forward each, nothing drafted.
    ar = _stats(engine, "ar", constraint)
    jumps = [c for c in ar.cycles if c.forced]
    assert ar.constraint is not None and len(jumps) == ar.constraint.forced_runs >= 1
    assert sum(c.forced for c in jumps) == ar.constraint.forced_tokens
    for c in jumps:
        assert c.mode == "ar" and c.drafted == 0 and c.block_size == c.forced + 1
    assert all(c.block_size == 1 and c.committed == 1 for c in ar.cycles if not c.forced)
    # Unconstrained spec has none.
    assert all(c.forced == 0 for c in _stats(engine, "spec", None).cycles)
