"""Positional sparse prefill: true positions, lossless decoding inside the sparse lineage,
and the lineage rule (never reusable, seeded only by a dense prefix before the first gap)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from toolflash.cache.key import SnapshotKey
from toolflash.cache.snapshot import Snapshot
from toolflash.engine.session import GenerationSession
from toolflash.engine.sparse import SparseLineageError, SparseSelection, SparseSelectionError
from toolflash.engine.sparse_prefill import sparse_prefill
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target

from .tiny_models import drafter_for, qwen3_target, qwen35_target

PROMPT = [(7 * i + 3) % 250 for i in range(80)]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def pair(request: Any) -> tuple[Any, Any]:
    model = qwen3_target() if request.param == "qwen3" else qwen35_target()
    adapter = Qwen3Target(model) if request.param == "qwen3" else Qwen35Target(model)
    return adapter, drafter_for(model)


def decode(session: GenerationSession, mode: Any, n: int = 40) -> list[int]:
    while len(session.tokens) < len(PROMPT) + 1 + n:
        session.step(mode, 8, lambda c: None)
    return session.tokens[len(PROMPT) : len(PROMPT) + 1 + n]


def test_full_selection_equals_dense(pair: Any) -> None:
    target, drafter = pair
    dense = GenerationSession(target, drafter, prefill_chunk=16)
    dense.prefill(PROMPT)
    sparse = GenerationSession(target, drafter, prefill_chunk=16)
    sparse_prefill(sparse, PROMPT, SparseSelection(((0, 80),), chunk=16))
    assert decode(sparse, "spec") == decode(dense, "spec")


def test_sparse_lineage_is_lossless_and_positional(pair: Any) -> None:
    target, drafter = pair
    selection = SparseSelection(((0, 16), (48, 80)), chunk=16)
    outs = []
    for mode in ("ar", "spec"):
        s = GenerationSession(target, drafter, prefill_chunk=16)
        sparse_prefill(s, PROMPT, selection)
        assert s.lineage == "sparse" and s.position_shift == 32
        outs.append(decode(s, mode))
    assert outs[0] == outs[1]
    # Layer-0 keys do not depend on context: the kept tokens' keys must equal a dense run's
    # keys at the same true positions (RoPE at original positions, not compacted ones).
    dense = GenerationSession(target, drafter)
    dense.prefill(PROMPT)
    s = GenerationSession(target, drafter, prefill_chunk=16)
    sparse_prefill(s, PROMPT, selection)
    attn = next(i for i, c in enumerate(s.cache) if hasattr(c, "offset"))
    k_sparse = s.cache[attn].keys[..., : s.cache[attn].offset, :]
    k_dense = dense.cache[attn].keys
    if attn == 0:
        want = mx.concatenate([k_dense[..., 0:16, :], k_dense[..., 48:80, :]], axis=2)
        assert mx.allclose(k_sparse, want, atol=1e-5).item()
    # The drafter context rows carry the true positions.
    assert s.draft_ctx is not None
    s.draft_ctx.absorb()
    assert s.draft_ctx.positions_array().tolist()[:17] == [*range(16), 48]


def test_sparse_state_is_never_reusable(pair: Any) -> None:
    target, drafter = pair
    s = GenerationSession(target, drafter, prefill_chunk=16)
    sparse_prefill(s, PROMPT, SparseSelection(((0, 16), (32, 80)), chunk=16))
    with pytest.raises(SparseLineageError):
        s.export_state()
    key = SnapshotKey("t", None, (), None, None, "h", "float32")
    with pytest.raises(TypeError):
        Snapshot(key=key, state=s)  # type: ignore[arg-type]


def test_dense_prefix_may_seed_a_sparse_session(pair: Any) -> None:
    target, drafter = pair
    selection = SparseSelection(((0, 32), (48, 80)), chunk=16)
    cold = GenerationSession(target, drafter, prefill_chunk=16)
    sparse_prefill(cold, PROMPT, selection)
    want = decode(cold, "spec")
    seed = GenerationSession(target, drafter, prefill_chunk=16)
    seed.prefill(PROMPT[:32])
    state = seed.export_state()
    warm = GenerationSession(target, drafter, prefill_chunk=16)
    sparse_prefill(warm, PROMPT, selection, restore=state)
    assert decode(warm, "spec") == want
    # A dense prefix reaching past the first dropped position is refused.
    deep = GenerationSession(target, drafter)
    deep.prefill(PROMPT[:40])
    with pytest.raises(SparseSelectionError, match="first dropped position 32"):
        sparse_prefill(
            GenerationSession(target, drafter), PROMPT, selection, restore=deep.export_state()
        )


@pytest.mark.parametrize(
    "ranges,match",
    [
        (((0, 10), (32, 80)), "not chunk-contiguous"),
        (((0, 16), (17, 80)), "not chunk-contiguous"),
        (((0, 16), (32, 64)), "must end at the end"),
        (((32, 48), (16, 80)), "out of order"),
        ((), "empty"),
    ],
)
def test_bad_selections_are_refused(ranges: Any, match: str) -> None:
    with pytest.raises(SparseSelectionError, match=match):
        SparseSelection(ranges, chunk=16).validate(80)


def test_dense_head_of_a_sparse_prefill_is_published_as_dense(pair: Any) -> None:
    """Positions before the first dropped chunk are an ordinary dense prefill: a state
    published there equals a dense session's at the same prefix (and is reusable by it);
    positions after it are never published."""
    target, drafter = pair
    selection = SparseSelection(((0, 32), (48, 80)), chunk=16)
    published: list[Any] = []
    s = GenerationSession(target, drafter, prefill_chunk=16)
    sparse_prefill(s, PROMPT, selection, publish_at=(16, 32, 64), publish=published.append)
    assert [len(p.tokens) for p in published] == [16, 32]
    assert s.lineage == "sparse" and s.computed_prompt_tokens == 64
    dense = GenerationSession(target, drafter, prefill_chunk=16)
    dense.prefill(PROMPT[:32])
    want = dense.export_state()
    assert published[1].tokens == want.tokens
    assert mx.allclose(published[1].last_logits, want.last_logits, atol=1e-5).item()
    # A dense request restoring it decodes exactly as a cold dense one.
    cold = GenerationSession(target, drafter, prefill_chunk=16)
    cold.prefill(PROMPT)
    warm = GenerationSession(target, drafter, prefill_chunk=16)
    warm.prefill(PROMPT, restore=published[1])
    assert warm.computed_prompt_tokens == len(PROMPT) - 32
    assert decode(warm, "spec") == decode(cold, "spec")
