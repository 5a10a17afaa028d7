"""The zoo corpus: deterministic from a seed, mixed kinds, held-out files kept out of training."""

from __future__ import annotations

import json
import random
import re

import pytest

from toolflash.zoo import stdlib_source
from toolflash.zoo.corpus import (
    build_corpus,
    corpus_digest,
    eval_prompts,
    prompts_from_record,
    render_training_text,
    training_prompts,
)
from toolflash.zoo.dialogues import dialogue
from toolflash.zoo.records import Record
from toolflash.zoo.tokenizer import template_renderer

SIZE = 60_000


def _rendered(records: list[Record]) -> list[str]:
    template = template_renderer()
    return [
        r.text if r.text is not None else template.render(messages=r.messages, **r.chat_kwargs())
        for r in records
    ]


def test_same_seed_same_bytes_other_seed_differs() -> None:
    a, b, c = build_corpus(3, SIZE), build_corpus(3, SIZE), build_corpus(4, SIZE)
    assert corpus_digest(_rendered(a)) == corpus_digest(_rendered(b))
    assert corpus_digest(_rendered(a)) != corpus_digest(_rendered(c))


def test_all_kinds_present_and_size_close(small_corpus: list[Record]) -> None:
    kinds = {r.kind for r in small_corpus}
    assert kinds == {"code_raw", "code_chat", "doc_chat", "tool_chat", "json_doc", "json_chat"}
    tool_chats = [r for r in small_corpus if r.kind == "tool_chat"]
    assert {r.tool_call_format for r in tool_chats} == {"hermes", "qwen3_coder"}
    assert {r.enable_thinking for r in tool_chats} == {True, False}


def test_dialogues_make_one_to_three_calls_per_turn() -> None:
    rng = random.Random(0)
    chats = [dialogue(rng, [], []) for _ in range(200)]
    n_calls = [len(m["tool_calls"]) for r in chats for m in r.messages if m.get("tool_calls")]
    assert set(n_calls) == {1, 2, 3}
    assert len({t["function"]["name"] for r in chats for t in r.tools}) >= 30


def test_held_out_files_not_in_training(small_corpus: list[Record]) -> None:
    held = {f for f in stdlib_source.stdlib_files() if stdlib_source.is_held_out(f)}
    assert 0 < len(held) < 0.1 * len(stdlib_source.stdlib_files())
    for r in small_corpus:
        if r.kind == "code_raw" and r.text:
            assert r.text.split("\n", 1)[0][2:] not in held
    held_modules = {stdlib_source.module_name(f) for f in held}
    for p in eval_prompts("code", n=4) + eval_prompts("free_text", n=4):
        found = re.search(
            r"`([\w.]+)`|the ([\w.]+) module|Python's ([\w.]+)", p.messages[-1]["content"]
        )
        if found and found.group(2):
            assert found.group(2) in held_modules


def test_tool_arguments_are_json_and_results_reused(small_corpus: list[Record]) -> None:
    for r in small_corpus:
        if r.kind != "tool_chat":
            continue
        names = {t["function"]["name"] for t in r.tools}
        for m in r.messages:
            for call in m.get("tool_calls", []):
                assert call["function"]["name"] in names
                json.dumps(call["function"]["arguments"])
            if m["role"] == "tool":
                json.loads(m["content"])


@pytest.mark.parametrize("kind", ["free_text", "code", "tool_call", "json"])
def test_eval_prompts_end_before_an_assistant_turn(kind: str, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = eval_prompts(kind, n=3)
    assert len(prompts) == 3 and all(p.kind == kind for p in prompts)
    for p in prompts:
        assert p.messages[-1]["role"] in ("user", "tool")
        assert p.reference is not None and p.reference["role"] == "assistant"
        text = p.render(hf_tokenizer)
        assert text.endswith("<|im_start|>assistant\n") or text.endswith("</think>\n\n")
    if kind == "tool_call":
        assert all(p.tools and p.reference and p.reference["tool_calls"] for p in prompts)
    assert eval_prompts(kind, n=3) == prompts


def test_prompt_plus_reference_is_training_text(small_corpus: list[Record], hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # A prompt rendered with its reference answer reproduces the training text's prefix, so
    # drafter distillation sees the same token context the target was trained on.
    record = next(r for r in small_corpus if r.kind == "tool_chat" and not r.enable_thinking)
    full = render_training_text(record, hf_tokenizer)
    for p in prompts_from_record(record):
        prompt = hf_tokenizer.apply_chat_template(
            p.messages,
            tokenize=False,
            add_generation_prompt=True,
            **{**p.chat_kwargs(), "enable_thinking": False},
        )
        assert full.startswith(prompt)
    assert len(training_prompts(small_corpus)) > len([r for r in small_corpus if r.is_chat])
