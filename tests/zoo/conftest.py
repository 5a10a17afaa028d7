"""Shared fixtures: one small corpus and its tokenizer, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolflash.zoo.corpus import build_corpus
from toolflash.zoo.records import Record
from toolflash.zoo.tokenizer import build_tokenizer

SMALL_SIZE = 150_000


@pytest.fixture(scope="session")
def small_corpus() -> list[Record]:
    return build_corpus(seed=0, size=SMALL_SIZE)


@pytest.fixture(scope="session")
def tokenizer_dir(small_corpus: list[Record], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(small_corpus, tmp_path_factory.mktemp("zoo") / "tokenizer")


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))
