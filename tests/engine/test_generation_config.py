"""Sampling defaults read from a model's generation_config.json."""

from __future__ import annotations

import json
from pathlib import Path

from toolflash.engine.generation_config import read_generation_defaults


def write(tmp_path: Path, config: object) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return tmp_path


def test_qwen_style_defaults(tmp_path: Path) -> None:
    d = write(tmp_path, {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95})
    assert read_generation_defaults(d) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20.0}


def test_without_do_sample_the_temperature_is_not_a_default(tmp_path: Path) -> None:
    d = write(tmp_path, {"temperature": 0.7, "top_p": 0.8, "min_p": 0.1})
    assert read_generation_defaults(d) == {"top_p": 0.8, "min_p": 0.1}


def test_missing_broken_and_out_of_range(tmp_path: Path) -> None:
    assert read_generation_defaults(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text("{not json")
    assert read_generation_defaults(tmp_path) == {}
    d = write(tmp_path, {"do_sample": True, "temperature": "hot", "top_p": 1.5, "top_k": True})
    assert read_generation_defaults(d) == {}
