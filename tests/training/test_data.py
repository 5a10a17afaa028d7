"""Reading prompts (chat, text, recorded traffic) and distilling the target's continuations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.training.data import (
    DataError,
    PromptRecord,
    distill,
    example_from,
    load_prompt_records,
    split_holdout,
    stop_token_ids,
    subsample,
)
from toolflash.training.generation import generate

from ..engine.tiny_models import qwen3_target
from .helpers import char_tokenizer

TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_chat_text_and_tool_records(tmp_path: Path) -> None:
    tok = char_tokenizer()
    _write(
        tmp_path / "a.jsonl",
        [
            {"messages": [{"role": "user", "content": "hi"}]},
            {"messages": [{"role": "user", "content": "list"}], "tools": TOOLS},
            {"prompt": "def f(x):"},
            "plain",
            {"text": "json", "kind": "json"},
        ],
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("one\nprompt")
    records = load_prompt_records(tmp_path, tok)
    assert [r.kind for r in records] == ["chat", "tool", "text", "text", "json", "text"]
    chat = tok.decode(list(records[0].tokens))
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert '"name": "ls"' in tok.decode(list(records[1].tokens))
    assert tok.decode(list(records[5].tokens)) == "one\nprompt"
    assert all(r.response is None for r in records)


def test_recorded_traffic(tmp_path: Path) -> None:
    tok = char_tokenizer()
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    record = {
        "request": {"messages": [{"role": "user", "content": "go"}], "tools": TOOLS},
        "response": {
            "choices": [{"message": {"role": "assistant", "content": "ok", "tool_calls": [call]}}]
        },
    }
    path = _write(tmp_path / "traffic.jsonl", [record])
    regen = load_prompt_records(path, tok)
    assert regen[0].response is None and regen[0].kind == "tool"
    recorded = load_prompt_records(path, tok, use_recorded=True)[0]
    assert recorded.tokens == regen[0].tokens
    assert recorded.response is not None
    reply = tok.decode(list(recorded.response))
    assert reply.startswith("ok<tool_call>") and reply.endswith("</tool_call><|im_end|>")


def test_conversation_ending_with_the_assistant(tmp_path: Path) -> None:
    tok = char_tokenizer()
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a!"}]
    path = _write(tmp_path / "c.jsonl", [{"messages": turns, "enable_thinking": False}])
    regen = load_prompt_records(path, tok)[0]
    assert tok.decode(list(regen.tokens)).endswith("q<|im_end|>\n<|im_start|>assistant\n")
    recorded = load_prompt_records(path, tok, use_recorded=True)[0]
    assert recorded.response is not None
    assert tok.decode(list(recorded.response)) == "a!<|im_end|>"


def test_use_recorded_without_a_response_fails(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"messages": [{"role": "user", "content": "x"}]}])
    with pytest.raises(DataError, match="t.jsonl:1"):
        load_prompt_records(path, char_tokenizer(), use_recorded=True)


def test_bad_inputs(tmp_path: Path) -> None:
    tok = char_tokenizer()
    with pytest.raises(DataError, match="no training data"):
        load_prompt_records(tmp_path / "missing", tok)
    path = tmp_path / "bad.jsonl"
    path.write_text("{not json\n")
    with pytest.raises(DataError, match="bad.jsonl:1"):
        load_prompt_records(path, tok)


def test_stop_token_ids() -> None:
    tok = char_tokenizer()
    ids = stop_token_ids(tok)
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids
    assert tok.convert_tokens_to_ids("<|endoftext|>") in ids


def test_example_truncation_and_loss_mask() -> None:
    ex = example_from(list(range(10)), [50, 51, 52], "text", max_len=8)
    assert ex is not None
    assert ex.tokens.tolist() == [5, 6, 7, 8, 9, 50, 51, 52]
    assert ex.loss_mask.tolist() == [False] * 5 + [True] * 3
    assert example_from([1, 2], [3], "text", 8) is None  # no valid anchor


def test_distill_is_the_targets_greedy_continuation() -> None:
    target = Qwen3Target(qwen3_target())
    prompt = [3, 17, 42, 99, 7]
    reference = generate(target, prompt, 12, ()).output
    stop = reference[5]
    examples = distill(
        target, [prompt, PromptRecord((1, 2, 3), "chat", (4, 5, 6))], {stop}, 12, progress=False
    )
    first = examples[0]
    assert first.tokens[: first.prompt_len].tolist() == prompt
    # Stops at (and keeps) the first stop token.
    assert first.tokens[first.prompt_len :].tolist() == reference[: reference.index(stop) + 1]
    assert examples[1].tokens.tolist() == [1, 2, 3, 4, 5, 6] and examples[1].kind == "chat"


def test_split_holdout_is_stratified() -> None:
    records = [PromptRecord((i,), "a" if i < 6 else "b") for i in range(10)]
    train, held = split_holdout(records, 4, seed=0)
    assert len(held) == 4 and len(train) == 6
    assert {r.kind for r in held} == {"a", "b"} and {r.kind for r in train} == {"a", "b"}
    assert not set(r.tokens for r in held) & set(r.tokens for r in train)
    again, _ = split_holdout(records, 4, seed=0)
    assert again == train
    assert np.unique([r.tokens for r in held + train]).size == 10


def test_subsample_is_seeded_random_in_file_order() -> None:
    records = [PromptRecord((i,), "a" if i < 50 else "b") for i in range(100)]
    picked = subsample(records, 10, seed=0)
    assert len(picked) == 10 and {r.kind for r in picked} == {"a", "b"}
    assert [r.tokens for r in picked] == sorted(r.tokens for r in picked)
    assert subsample(records, 10, seed=0) == picked
    assert subsample(records, 200, seed=0) == records
