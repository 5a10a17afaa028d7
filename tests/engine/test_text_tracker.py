"""Incremental detokenization: the deltas add up to the full decode, whatever the chunking."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from transformers import AutoTokenizer

from toolflash.engine.text import TextTracker

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "toolflash" / "assets" / "tiny" / "qwen3-tiny"
TEXTS = [
    "def parse(x):\n    return {'a': 1, \"b\": [2, 3]}\n",
    "héllo wörld, naïve café: 🙂🚀 日本語のテキスト and Ελληνικά.",
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/ü.py"}}\n</tool_call>',
]


@pytest.fixture(scope="module")
def engine() -> Any:
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    return SimpleNamespace(decode=lambda ids: tok.decode(list(ids)), tok=tok)


def _chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 5)
        out.append(ids[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_full_decode(engine: Any, text: str, seed: int) -> None:
    ids = engine.tok.encode(text, add_special_tokens=False)
    tracker = TextTracker(engine.decode, (), frozenset({2}))
    out = "".join(tracker.push(c) for c in _chunks(ids + [2], random.Random(seed)))
    out += tracker.flush()
    assert out == engine.decode(ids) == text
    assert "\ufffd" not in out


def test_random_byte_tokens_never_show_a_partial_character(engine: Any) -> None:
    rng = random.Random(0)
    vocab = engine.tok.vocab_size if hasattr(engine.tok, "vocab_size") else 4096
    ids = [rng.randrange(10, vocab) for _ in range(400)]
    tracker = TextTracker(engine.decode, (), frozenset({2}))
    deltas = [tracker.push([t]) for t in ids]
    assert "".join(deltas) + tracker.flush() == engine.decode(ids)


def test_stop_string_across_windows(engine: Any) -> None:
    text = "alpha beta STOP gamma"
    ids = engine.tok.encode(text, add_special_tokens=False)
    tracker = TextTracker(engine.decode, ("STOP",), frozenset({2}))
    out = ""
    for t in ids:
        out += tracker.push([t])
        if tracker.stopped:
            break
    assert tracker.stopped and out == "alpha beta "
