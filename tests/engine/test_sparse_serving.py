"""Sparse prefill through the engine: the chunk scorer's choices, the response's report, and
the lineage rule against the prefix cache (publish, restore, L2 round trip, a sparse request
followed by a dense one on the same prefix)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolflash.cache.prefix_cache import CacheConfig, PrefixCache
from toolflash.engine.api import FinishEvent, GenerationRequest, TokenEvent
from toolflash.engine.factory import build_engine
from toolflash.engine.sparse import SparsePrefill
from toolflash.engine.sparse_scoring import (
    PromptLayout,
    choose_chunks,
    plan_sparse,
    prompt_layout,
    recency_scores,
)

from .model_dirs import write_draft, write_qwen3_target, write_qwen35_target

FAMILIES = {"qwen3": write_qwen3_target, "qwen3_5": write_qwen35_target}
SPARSE = SparsePrefill(keep=0.5, min_tokens=64, chunk=16)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model_dirs(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp(request.param)
    config = FAMILIES[request.param](root / "target")
    write_draft(root / "draft", config)
    return root / "target", root / "draft"


def engine_for(dirs: tuple[Path, Path], cache: PrefixCache | None) -> Any:
    engine = build_engine(str(dirs[0]), str(dirs[1]))
    engine.prefix_cache = cache
    return engine


def run(engine: Any, prompt: list[int], n: int = 16, **kw: Any) -> tuple[list[int], Any]:
    tokens: list[int] = []
    stats = None
    for event in engine.generate(GenerationRequest(tuple(prompt), n, ignore_eos=True, **kw)):
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            stats = event.stats
    return tokens, stats


def long_chat(engine: Any) -> tuple[list[int], int]:
    """A prompt of a few hundred tokens and its system prompt's end (the stable prefix)."""
    body = " ".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(40))
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": body},
        {"role": "assistant", "content": "Read it."},
        {"role": "user", "content": "def add(a, b):"},
    ]
    prompt = engine.encode_chat(messages)
    stable = engine.stable_prefix(messages[:1], None, None, prompt)
    assert 0 < stable < len(prompt) and len(prompt) >= 4 * SPARSE.min_tokens
    return prompt, stable


def test_a_sparse_request_reports_itself_and_publishes_only_its_dense_head(
    model_dirs: Any, tmp_path: Path
) -> None:
    cold = engine_for(model_dirs, None)
    prompt, stable = long_chat(cold)
    want, dense_stats = run(cold, prompt)
    assert not dense_stats.sparse and dense_stats.computed_tokens == len(prompt)

    cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path / "l2")))
    warm = engine_for(model_dirs, cache)
    _, stats = run(warm, prompt, sparse_prefill=SPARSE, publish_at=(stable,))
    assert stats.sparse and stats.cached_tokens == 0
    assert len(prompt) // 3 < stats.computed_tokens < len(prompt)
    # Only the dense head (the system prompt, before the first dropped chunk) was published:
    # no end-of-request snapshot of the sparse session.
    assert cache.counters["published"] == 1

    # A dense request on the same prompt restores at most that head and decodes exactly as
    # a cold dense one; in L1 and after a restart from L2.
    got, stats2 = run(warm, prompt)
    assert got == want and not stats2.sparse
    assert stats2.cached_tokens == stable
    assert stats2.computed_tokens == len(prompt) - stable
    assert cache.l2 is not None
    cache.l2.flush()
    cache.close()
    warm.prefix_cache = PrefixCache(CacheConfig(l2_dir=str(tmp_path / "l2")))  # "restart"
    got, stats3 = run(warm, prompt)
    assert got == want and stats3.cached_tokens == stable


def test_a_dense_state_may_seed_a_sparse_request(model_dirs: Any) -> None:
    cache = PrefixCache(CacheConfig())
    engine = engine_for(model_dirs, cache)
    prompt, stable = long_chat(engine)
    run(engine, prompt, publish_at=(stable,))  # publishes the system prompt's state
    published = cache.counters["published"]
    _, stats = run(engine, prompt, sparse_prefill=SPARSE)
    assert stats.sparse and stats.cached_tokens == stable
    assert stats.computed_tokens < len(prompt) - stable
    # The sparse session published nothing; a dense request still gets the dense head only.
    assert cache.counters["published"] == published
    _, dense = run(engine, prompt)
    assert cache.counters["published"] == published + 1
    assert not dense.sparse and dense.cached_tokens == stable


def test_short_prompts_prefill_dense(model_dirs: Any) -> None:
    engine = engine_for(model_dirs, None)
    prompt = engine.encode_chat([{"role": "user", "content": "def add(a, b):"}])
    assert len(prompt) < SPARSE.min_tokens
    want, _ = run(engine, prompt)
    got, stats = run(engine, prompt, sparse_prefill=SPARSE)
    assert got == want and not stats.sparse and stats.computed_tokens == len(prompt)


# -- the chunk scorer ------------------------------------------------------------------------
def test_choose_chunks_keeps_rules_then_best_scores() -> None:
    # 1000 tokens, messages at 0 (system), 300 (user), 900 (last user), 980 (header).
    layout = PromptLayout(1000, (0, 300, 900, 980), anchors=(200,))
    sel = choose_chunks(layout, 0.3, 50, "structural", recency_scores(1000, 50))
    kept = {lo // 50 for lo, hi in sel.ranges for lo in range(lo, hi, 50)}
    assert len(kept) == 6 and sel.kept == 300
    # head (128 tokens: chunks 0-2), the last turn from its end (19, 18 of 900-1000),
    # then the tool anchor's chunk (4).
    assert kept == {0, 1, 2, 4, 18, 19}
    sel.validate(1000)
    recent = choose_chunks(layout, 0.3, 50, "recent", recency_scores(1000, 50))
    assert recent.ranges == ((0, 150), (850, 1000))
    # A restored dense prefix is always kept (it seeds the session), beyond the budget too.
    seeded = choose_chunks(layout, 0.1, 50, "structural", recency_scores(1000, 50), 400)
    assert seeded.ranges[0] == (0, 400) and seeded.ranges[-1][1] == 1000
    seeded.validate(1000, 400)


def test_similarity_prefers_chunks_like_the_last_turn() -> None:
    layout = PromptLayout(64, (0, 48), ())
    scores = [0.0, 0.9, 0.1, 1.0]
    sel = choose_chunks(layout, 0.5, 16, "similarity", scores)
    assert sel.ranges == ((0, 16), (48, 64))  # the end, then the head (the budget is spent)
    sel = choose_chunks(PromptLayout(256, (0, 240), ()), 0.25, 16, "similarity", [0.0] * 16)
    assert sel.kept == 64


def test_prompt_layout_finds_messages_and_tool_definitions() -> None:
    text = (
        '@system\n<tools>\n{"type": "function", "name": "a"}\n'
        '{"type": "function", "name": "b"}\n</tools>@user\nhi@assistant\n'
    )
    ids = [1 if c == "@" else ord(c) for c in text]  # one token per character, "@" = start

    def decode(tokens: Any) -> str:
        return "".join("@" if t == 1 else chr(t) for t in tokens)

    layout = prompt_layout(ids, 1, decode)
    assert layout.message_starts == tuple(i for i, c in enumerate(text) if c == "@")
    assert [text[a : a + 8] for a in layout.anchors] == ['{"type":', '{"type":', "</tools>"]
    assert layout.last_turn == text.index("@user")


def test_plan_sparse_only_when_enough_is_left_to_compute() -> None:
    layout = PromptLayout(512, (0, 480), ())
    settings = SparsePrefill(keep=0.25, min_tokens=256, chunk=32, scorer="structural")
    embed: Any = None  # not used by the structural scorer
    assert plan_sparse(settings, list(range(512)), layout, embed) is not None
    assert plan_sparse(settings, list(range(512)), layout, embed, dense_prefix=300) is None
    with pytest.raises(ValueError, match="keep"):
        SparsePrefill(keep=0.0)
    with pytest.raises(ValueError, match="scorer"):
        SparsePrefill(keep=0.5, scorer="random")  # type: ignore[arg-type]


def test_a_sparse_request_in_the_continuous_batch_decodes_alone(model_dirs: Any) -> None:
    """Beside dense requests that batch, a sparse one keeps its true positions (it never
    becomes a batch row) and every output equals the one it gets alone."""
    from toolflash.engine.batching.batcher import EngineBatcher

    engine = engine_for(model_dirs, None)
    prompt, _ = long_chat(engine)
    reqs = {
        "sparse": GenerationRequest(tuple(prompt), 20, ignore_eos=True, sparse_prefill=SPARSE),
        "a": GenerationRequest(tuple(prompt[:40]), 24, ignore_eos=True, mode="ar"),
        "b": GenerationRequest(tuple(prompt[:50]), 16, ignore_eos=True),
    }
    want = {key: run(engine, list(r.prompt_tokens), r.max_tokens, mode=r.mode,
                     sparse_prefill=r.sparse_prefill)[0] for key, r in reqs.items()}  # fmt: skip
    batcher = EngineBatcher(engine)
    for key, r in reqs.items():
        batcher.add(key, r)
    got: dict[str, list[int]] = {}
    finish: dict[str, Any] = {}
    for _ in range(500):
        if not batcher.size:
            break
        for key, events in batcher.step():
            assert not isinstance(events, BaseException), events
            for event in events:
                if isinstance(event, TokenEvent):
                    got.setdefault(str(key), []).extend(event.token_ids)
                else:
                    finish[str(key)] = event
    assert got == want
    assert finish["sparse"].stats.sparse and not finish["a"].stats.sparse
    assert finish["sparse"].stats.computed_tokens < len(prompt)
