"""One drafter forward for several batch rows (`engine/batching/drafts.py`): each row's logits
are those of its session drafting alone, whatever the rows' context lengths."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from toolflash.engine.batching.drafts import dflash_logits, shares_drafter
from toolflash.engine.draft_context import DraftWindow
from toolflash.engine.session import GenerationSession, dflash_proposal
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target

from .tiny_models import drafter_for, qwen3_target, qwen35_target

PROMPTS = [[(7 * i + 3 + k) % 250 for i in range(n)] for k, n in enumerate((40, 13, 27, 40))]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def pair(request: Any) -> tuple[Any, Any]:
    model = qwen3_target() if request.param == "qwen3" else qwen35_target()
    adapter = Qwen3Target(model) if request.param == "qwen3" else Qwen35Target(model)
    return adapter, drafter_for(model)


def sessions(pair: tuple[Any, Any], window: DraftWindow | None = None) -> list[Any]:
    out = []
    for prompt in PROMPTS:
        s = GenerationSession(*pair, window=window)
        s.prefill(prompt)
        out.append(s)
    return out


@pytest.mark.parametrize("block", [4, 8])
def test_each_row_drafts_what_its_session_drafts_alone(pair: tuple[Any, Any], block: int) -> None:
    rows = sessions(pair)
    assert shares_drafter(rows)
    together = dflash_logits(rows, block)
    assert together.shape[:2] == (len(rows), block - 1)
    for i, s in enumerate(rows):
        alone = dflash_proposal(s, block)[0]
        assert mx.allclose(together[i], alone, atol=1e-4, rtol=1e-4).item()
        assert mx.array_equal(mx.argmax(together[i], -1), mx.argmax(alone, -1)).item()


def test_equal_contexts_need_no_mask(pair: tuple[Any, Any]) -> None:
    rows = sessions(pair)
    same = [rows[0], rows[3]]  # two 40-token prompts
    together = dflash_logits(same, 8)
    for i, s in enumerate(same):
        assert mx.allclose(together[i], dflash_proposal(s, 8)[0], atol=1e-4, rtol=1e-4).item()


def test_rows_with_another_proposer_draft_alone(pair: tuple[Any, Any]) -> None:
    rows = sessions(pair)
    rows[1].proposer = lambda session, block: dflash_proposal(session, block)
    assert not shares_drafter(rows)
    assert shares_drafter([rows[0], rows[2]])
