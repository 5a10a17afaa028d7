"""The engine decodes through the fast tokenizer itself only where that gives the wrapper's text."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import AutoTokenizer

from toolflash.engine.text import decodes_as_wrapper, fast_backend

ASSETS = Path(__file__).resolve().parents[2] / "toolflash" / "assets" / "tiny"


@pytest.mark.parametrize("name", ["qwen35-tiny", "qwen3-tiny"])
def test_fast_decode_equals_the_wrapper_on_random_token_runs(name: str) -> None:
    tok = TokenizerWrapper(AutoTokenizer.from_pretrained(ASSETS / name))  # as the engine loads it
    backend = fast_backend(tok)
    assert backend is not None and decodes_as_wrapper(tok, backend)
    text = (
        "<think>\nhéllo wörld 🙂 日本語 Ελληνικά</think>\n\ndef f(x):\n    return {'a': x}  # ü\n"
    )
    ids = tok.encode(text * 3, add_special_tokens=False)
    rng = random.Random(0)
    for _ in range(2000):
        i = rng.randrange(len(ids))
        run = ids[i : i + rng.randint(1, 6)]  # runs that split multi-byte characters too
        assert backend.decode(run, skip_special_tokens=False) == tok.decode(run)


def test_a_wrapper_that_cleans_up_spaces_keeps_its_own_decode() -> None:
    tok = AutoTokenizer.from_pretrained(ASSETS / "qwen35-tiny", clean_up_tokenization_spaces=True)
    assert not decodes_as_wrapper(tok, fast_backend(tok))
    assert not decodes_as_wrapper(tok, None)
