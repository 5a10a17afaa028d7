"""The zoo tokenizer: byte-level round trips, special tokens as single fixed ids, offline loading."""

from __future__ import annotations

import json
from pathlib import Path

from toolflash.zoo.tokenizer import MARKUP_TOKENS, MASK_TOKEN, SPECIAL_TOKENS, VOCAB_SIZE

SAMPLES = [
    "def f(x):\n    return {'a': [1, 2.5, None]}  # done\n",
    "class Foo(Bar):\n\tpass\n\n\n",
    "héllo wörld — naïve café ✓ 你好 🙂 \u00a0tab\there",
    '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}',
    "    \n  trailing spaces   \r\nwindows line",
]


def test_round_trip_code_and_unicode(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    for text in SAMPLES:
        ids = hf_tokenizer.encode(text, add_special_tokens=False)
        assert hf_tokenizer.decode(ids) == text


def test_vocab_size_and_fixed_special_ids(hf_tokenizer, tokenizer_dir: Path) -> None:  # type: ignore[no-untyped-def]
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    assert len(spec["model"]["vocab"]) == VOCAB_SIZE
    vocab = hf_tokenizer.get_vocab()
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        assert vocab[token] == expected_id
        assert hf_tokenizer.encode(token, add_special_tokens=False) == [expected_id]
        # ...also inside text, glued to neighbours
        ids = hf_tokenizer.encode(f"x{token}y", add_special_tokens=False)
        assert expected_id in ids


def test_markup_tokens_survive_decoding_control_tokens_do_not(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = "<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    kept = hf_tokenizer.decode(ids, skip_special_tokens=True)
    for token in MARKUP_TOKENS[:2] + MARKUP_TOKENS[4:]:
        assert token in kept
    assert "<|im_start|>" not in kept and "<|im_end|>" not in kept


def test_mask_token_never_in_corpus(small_corpus, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from toolflash.zoo.corpus import render_training_text

    mask_id = hf_tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    for record in small_corpus[:200]:
        ids = hf_tokenizer.encode(
            render_training_text(record, hf_tokenizer), add_special_tokens=False
        )
        assert mask_id not in ids


def test_loads_offline_with_mlx_lm(tokenizer_dir: Path) -> None:
    from mlx_lm.tokenizer_utils import load

    wrapper = load(tokenizer_dir)
    assert wrapper.eos_token_ids == {SPECIAL_TOKENS.index("<|im_end|>")}
    assert wrapper.has_chat_template
    assert wrapper.tool_call_start == "<tool_call>" and wrapper.tool_call_end == "</tool_call>"
    assert wrapper.has_thinking and wrapper.think_start == "<think>"
