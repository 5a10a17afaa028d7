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
    for want in (8, 16, 16):  # cap: the ceiling
        s.observe(record(s.block, s.block - 1))
        assert s.block == want
    s.observe(record(16, 0))
    s.observe(record(16, 0))
    assert s.next_block(16) == 8
    assert s.next_block(4) == 4  # a new ceiling (a policy's new block) starts afresh
    s.observe(record(4, 3))
    assert s.block == 4


def test_ignores_what_says_nothing_of_the_drafter() -> None:
    s = DraftLengthSchedule(16)
    s.observe(record(1, 0, mode="ar"))
    s.observe(record(6, 0, forced=5, drafted=5))  # a grammar-forced run
    s.observe(record(3, 0, draft_cut=True))  # a draft the constraint ended
    assert s.block == 16
    tiny = DraftLengthSchedule(4, min_block=8)
    tiny.observe(record(4, 0))
    tiny.observe(record(4, 0))
    assert tiny.block == 4  # never above the ceiling, even when the floor is


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
        assert block == min(expected.next_block(top), left)
        expected.observe(record(block, accepted))
        left -= accepted + 1
    assert min(b for b, _ in blocks) < top
    # Fixed: every cycle drafts the whole block (until max_tokens leaves less room).
    assert {b for b, _ in spec_blocks(pinned.stats)[:20]} == {top}


class AlwaysSpec:
    """A policy that always decides spec at one block."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.blocks: list[int] = []

    def prepare(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> None:
        pass

    def observe_prefix(self, text: str) -> None:
        pass

    def start(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> Any:
        from toolflash.engine.api import ModeDecision

        return ModeDecision("spec", self.block, "start")

    def after_step(self, record: Any, token_ids: Any, text: str) -> Any:
        from toolflash.engine.api import ModeDecision

        self.blocks.append(record.block_size)
        return ModeDecision("spec", self.block, "same")

    def finish(self, stats: Any) -> None:
        pass


def test_engine_default_request_override_and_policy_ceiling(dirs: tuple[str, str]) -> None:
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
    # Under a policy its block is the ceiling and the schedule shortens drafts below it.
    engine = build_engine(*dirs)
    ref, _, _ = collect(engine, GenerationRequest(prompt, 40, mode="ar"))
    policy = AlwaysSpec(4)
    tokens = [
        t
        for event in engine.generate(GenerationRequest(prompt, 40, mode="spec"), None, policy)
        for t in getattr(event, "token_ids", ())
    ]
    assert tokens == ref
    assert policy.blocks[:4] == [4, 4, 2, 2] and max(policy.blocks) == 4
    # A policy alternating spec and AR: each spec cycle follows an AR step, so it starts
    # afresh at the policy's block.
    controller = ScriptedController()
    for _ in engine.generate(GenerationRequest(prompt, 40, mode="spec"), None, controller):
        pass
    assert {bs for m, bs, _ in controller.steps[:20] if m == "spec"} == {4}


def test_back_from_ar_the_block_starts_afresh(dirs: tuple[str, str]) -> None:
    engine = build_engine(*dirs)
    top = engine.default_block_size
    prompt = tuple(engine.encode("def add(a, b):"))
    ref, _, _ = collect(engine, GenerationRequest(prompt, 40, mode="ar"))
    plan = {5: "ar", 6: "spec"}
    tokens, _, finish = collect(
        engine,
        GenerationRequest(prompt, 40, mode="spec", mode_plan=plan),  # type: ignore[arg-type]
    )
    assert tokens == ref
    cycles = finish.stats.cycles
    assert cycles[4].block_size < top and cycles[5].mode == "ar"
    assert cycles[6].mode == "spec" and cycles[6].block_size == top
