"""Streaming detokenization cost: the engine's incremental text tracker vs decoding every
committed token again at each step, one token per step, with the embedded tokenizer.

    python benchmarks/detokenize.py [--tokens 4000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

from script_env import ensure_optimized_blas_for_script
from transformers import AutoTokenizer

from toolflash.engine.stops import visible_text
from toolflash.engine.text import TextTracker

ASSETS = Path(__file__).resolve().parents[1] / "toolflash" / "assets" / "tiny" / "qwen3-tiny"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=4000)
    args = p.parse_args()
    tok = AutoTokenizer.from_pretrained(ASSETS)
    engine = SimpleNamespace(decode=lambda ids: tok.decode(list(ids)))
    source = (Path(__file__).resolve().parents[1] / "engine" / "session.py").read_text()
    ids = tok.encode(source * 4, add_special_tokens=False)[: args.tokens]

    t0 = time.perf_counter()
    tracker = TextTracker(engine.decode, (), frozenset())
    incremental = "".join(tracker.push([t]) for t in ids) + tracker.flush()
    t1 = time.perf_counter()
    sent, text = 0, ""
    for i in range(1, len(ids) + 1):
        delta, _ = visible_text(engine.decode(ids[:i]), sent, ())
        sent += len(delta)
        text += delta
    t2 = time.perf_counter()
    assert incremental == text
    print(
        f"{len(ids)} tokens streamed one per step: incremental {1e3 * (t1 - t0):.0f} ms, "
        f"full re-decode {1e3 * (t2 - t1):.0f} ms"
    )


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
