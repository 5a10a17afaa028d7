"""`benchmarks/recurrence_chunks.py`: the recurrence timed by chunk length, each length really
used (the report names the device's default and every length asked for)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import recurrence_chunks  # noqa: E402

from toolflash.kernels import gated_delta  # noqa: E402


def test_every_chunk_length_is_timed_through_the_recurrence(tmp_path: Path, monkeypatch) -> None:
    seen: list[int] = []
    real = gated_delta.chunk_length

    def spy(tokens: int, long_chunk: int) -> int:
        seen.append(long_chunk)
        return real(tokens, long_chunk)

    monkeypatch.setattr(gated_delta, "chunk_length", spy)
    out = tmp_path / "r.json"
    argv = ["--shape", "tiny-hybrid", "--tokens", "96", "--chunks", "16,32", "--calls", "1"]
    assert recurrence_chunks.main([*argv, "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["ms_per_layer"]) == {"16", "32"}
    assert report["default_chunk"] == gated_delta.LONG_CHUNK_CPU and report["dtype"] == "float32"
    assert set(seen) == {16, 32}
