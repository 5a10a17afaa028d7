"""The embedded tiny family: it loads, decodes losslessly, and its drafter still accepts
(a regression guard on tokens per cycle, measured with the real draft-verify loop)."""

from __future__ import annotations

from typing import Any

import pytest

from toolflash.engine.api import FinishEvent, GenerationRequest, TokenEvent
from toolflash.engine.factory import assets_dir, build_engine

# Measured tau on the fixed prompt below minus a margin (see MODEL_CARD.md); a broken feature
# wiring, label shift or rollback bug drops it to ~1.0.
TAU_FLOOR = {"qwen3-tiny": 1.3, "qwen35-tiny": 4.0}  # measured 1.66 and 7.0 (49 and 36 tokens)
PROMPT = "What does `email.parser.__init__` do?"  # held out; both targets answer > 16 tokens


def run(engine: Any, mode: str) -> tuple[list[int], Any]:
    prompt = engine.encode_chat(
        [{"role": "user", "content": PROMPT}], None, {"enable_thinking": False}
    )
    tokens: list[int] = []
    stats = None
    for event in engine.generate(GenerationRequest(tuple(prompt), 128, mode=mode)):  # type: ignore[arg-type]
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            stats = event.stats
    return tokens, stats


@pytest.mark.parametrize("name", ["qwen3-tiny", "qwen35-tiny"])
def test_shipped_pair_is_lossless_and_accepts(name: str) -> None:
    base = assets_dir()
    engine = build_engine(str(base / name), str(base / f"{name}-dflash"))
    ar, _ = run(engine, "ar")
    spec, stats = run(engine, "spec")
    assert spec == ar and len(ar) > 16
    assert stats.tokens_per_cycle >= TAU_FLOOR[name]


def test_default_engine_is_the_embedded_hybrid_pair() -> None:
    engine = build_engine()
    assert engine.model_id == "toolflash-tiny-qwen35" and engine.drafter is not None
    assert engine.target.family == "qwen3_5"
    assert engine.tool_call_format == "hermes"


def test_embedded_pairs_load_by_their_served_ids() -> None:
    engine = build_engine("toolflash-tiny-qwen3")
    assert engine.model_id == "toolflash-tiny-qwen3" and engine.target.family == "qwen3"
    assert engine.draft_id == "toolflash-tiny-qwen3-dflash"
    # An explicit drafter keeps its own id.
    path = str(assets_dir() / "qwen3-tiny-dflash")
    assert build_engine("toolflash-tiny-qwen3", path).draft_id == path
