"""The adaptive draft length: the schedule's rule, and the engine using it only where no
policy decides the block, losslessly."""

from __future__ import annotations

from typing import Any

import pytest

from toolflash.engine.api import CycleRecord, GenerationRequest
from toolflash.engine.draft_length import DraftLengthSchedule
from toolflash.engine.factory import build_engine

from .model_dirs import write_draft, write_qwen3_target
from .test_service import ScriptedController, collect


def record(block: int, accepted: int, mode: str = "spec", **kw: Any) -> CycleRecord:
    drafted = kw.pop("drafted", block - 1 if mode == "spec" else 0)
    return CycleRecord(
        index=0,
        mode=mode,  # type: ignore[arg-type]
        block_size=block,
        drafted=drafted,
        accepted=accepted,
        committed=accepted + 1,
        draft_s=0.0,
        verify_s=0.0,
        rollback_s=0.0,
        context_len=0,
        **kw,
    )


def test_halves_on_rejected_drafts_and_doubles_on_a_full_one() -> None:
    s = DraftLengthSchedule(16)
    assert s.block == 16
    s.observe(record(16, 0))  # one rejection alone: common between two long runs
    assert s.block == 16
    s.observe(record(16, 3))  # and an accepted token resets the count
    s.observe(record(16, 0))
    assert s.block == 16
    for want in (8, 4, 2, 2):  # then each further rejection halves; floor: 2 still drafts
        s.observe(record(s.block, 0))
        assert s.block == want
    s.observe(record(2, 1))  # the whole draft of one token
    assert s.block == 4
    s.observe(record(4, 1))  # partial: stays
    assert s.block == 4
    for want in (8, 16, 16):  # cap: the largest block
        s.observe(record(s.block, s.block - 1))
        assert s.block == want


def test_ignores_what_says_nothing_of_the_drafter() -> None:
    s = DraftLengthSchedule(16)
    s.observe(record(1, 0, mode="ar"))
    s.observe(record(6, 0, forced=5, drafted=5))  # a grammar-forced run
    s.observe(record(3, 0, draft_cut=True))  # a draft the constraint ended
    assert s.block == 16
    assert DraftLengthSchedule(4, min_block=8).min_block == 4


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("models")
    config = write_qwen3_target(root / "target")
    write_draft(root / "draft", config)
    return str(root / "target"), str(root / "draft")


def spec_blocks(stats: Any) -> list[tuple[int, int]]:
    return [(c.block_size, c.accepted) for c in stats.cycles if c.mode == "spec"]


def test_engine_shortens_drafts_after_rejections_losslessly(dirs: tuple[str, str]) -> None:
    engine = build_engine(*dirs)  # adaptive by default
    prompt = tuple(engine.encode("def add(a, b):"))
    ar, _, _ = collect(engine, GenerationRequest(prompt, 48, mode="ar"))
    adaptive, _, got = collect(engine, GenerationRequest(prompt, 48, mode="spec"))
    fixed, _, pinned = collect(
        engine, GenerationRequest(prompt, 48, mode="spec", draft_length="fixed")
    )
    assert adaptive == ar == fixed
    blocks = spec_blocks(got.stats)
    top = engine.default_block_size  # the drafter's block (8 for the test drafter)
    # A random-weight drafter is rejected at once: 8, 8 -> 4 -> 2 and it stays there unless
    # a draft is accepted whole.
    assert blocks[0][0] == top and blocks[0][1] < top - 1
    expected = DraftLengthSchedule(top)
    left = 48 - 1  # the prefill emitted the first token
    for block, accepted in blocks:
        assert block == min(expected.block, left)
        expected.observe(record(block, accepted))
        left -= accepted + 1
    assert min(b for b, _ in blocks) < top
    # Fixed: every cycle drafts the whole block (until max_tokens leaves less room).
    assert {b for b, _ in spec_blocks(pinned.stats)[:20]} == {top}


def test_engine_default_and_policy_decide_over_the_schedule(dirs: tuple[str, str]) -> None:
    engine = build_engine(*dirs, draft_length="fixed")
    prompt = tuple(engine.encode("import os"))
    top = engine.default_block_size
    _, _, fixed = collect(engine, GenerationRequest(prompt, 40, mode="spec"))
    assert {b for b, _ in spec_blocks(fixed.stats)[:20]} == {top}
    # The request may ask for the schedule where the engine's default is fixed.
    _, _, adaptive = collect(
        engine, GenerationRequest(prompt, 40, mode="spec", draft_length="adaptive")
    )
    assert min(b for b, _ in spec_blocks(adaptive.stats)) < top
    # A policy's decisions stand: the scripted controller asks for block 4 every spec cycle.
    engine = build_engine(*dirs)
    controller = ScriptedController()
    for _ in engine.generate(GenerationRequest(prompt, 40, mode="spec"), None, controller):
        pass
    assert {bs for m, bs, _ in controller.steps[:20] if m == "spec"} == {4}
