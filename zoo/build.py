"""Build the tiny model family: corpus -> tokenizer -> targets, with per-stage wall times.

`build_family` returns a `FamilyBuild` naming every directory it wrote, so a later step
(`train_drafters`, owned by `toolflash.training`) can be appended with the same corpus/seed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import structlog

from toolflash.zoo.corpus import DEFAULT_SIZE, build_corpus, record_size
from toolflash.zoo.records import Record
from toolflash.zoo.target_configs import DIR_NAMES, FAMILIES, Family
from toolflash.zoo.tokenizer import build_tokenizer
from toolflash.zoo.train_target import TrainResult, tokenize_corpus, train_target

log = structlog.get_logger(__name__)

QUICK_SIZE = 300_000
QUICK_STEPS = 20


@dataclass
class FamilyBuild:
    """Where the family landed and what each stage cost."""

    root: Path
    seed: int
    corpus_size: int
    tokenizer_dir: Path
    target_dirs: dict[str, Path] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    training: dict[str, TrainResult] = field(default_factory=dict)
    corpus_records: int = 0
    corpus_bytes: int = 0
    corpus_tokens: int = 0
    corpus_digest: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "seed": self.seed,
            "corpus_size": self.corpus_size,
            "corpus_records": self.corpus_records,
            "corpus_bytes": self.corpus_bytes,
            "corpus_tokens": self.corpus_tokens,
            "corpus_digest": self.corpus_digest,
            "tokenizer_dir": str(self.tokenizer_dir),
            "target_dirs": {k: str(v) for k, v in self.target_dirs.items()},
            "stage_seconds": self.stage_seconds,
            "training": {k: asdict(v) for k, v in self.training.items()},
        }


def write_corpus(records: Sequence[Record], path: Path) -> None:
    """Save the records as JSON lines (for inspection and for drafter prompt extraction)."""
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")


def build_family(
    out: Path,
    seed: int = 0,
    corpus_size: int = DEFAULT_SIZE,
    steps: dict[Family, int] | None = None,
    families: Sequence[Family] = FAMILIES,
) -> FamilyBuild:
    """Build corpus, tokenizer and the target models under `out`; returns what it wrote.

    `out/tokenizer` holds the tokenizer, `out/qwen3-tiny` and `out/qwen35-tiny` the targets (each
    self-contained), `out/corpus.jsonl` the records and `out/build.json` this summary.
    """
    out.mkdir(parents=True, exist_ok=True)
    build = FamilyBuild(
        root=out, seed=seed, corpus_size=corpus_size, tokenizer_dir=out / "tokenizer"
    )

    t0 = time.perf_counter()
    records = build_corpus(seed, corpus_size)
    write_corpus(records, out / "corpus.jsonl")
    build.corpus_records = len(records)
    build.corpus_bytes = sum(record_size(r) for r in records)
    build.stage_seconds["corpus"] = round(time.perf_counter() - t0, 1)

    t0 = time.perf_counter()
    build_tokenizer(records, build.tokenizer_dir)
    build.stage_seconds["tokenizer"] = round(time.perf_counter() - t0, 1)

    t0 = time.perf_counter()
    stream, digest = tokenize_corpus(records, build.tokenizer_dir)
    build.corpus_tokens, build.corpus_digest = int(len(stream)), digest
    build.stage_seconds["tokenize"] = round(time.perf_counter() - t0, 1)
    _save(build)

    for family in families:
        t0 = time.perf_counter()
        target_dir = out / DIR_NAMES[family]
        build.training[family] = train_target(
            family,
            records,
            build.tokenizer_dir,
            target_dir,
            steps=(steps or {}).get(family),
            seed=seed,
            stream=stream,
            stream_digest=digest,
        )
        build.target_dirs[family] = target_dir
        build.stage_seconds[f"train_{family}"] = round(time.perf_counter() - t0, 1)
        _save(build)
    log.info("zoo.build.done", **{k: v for k, v in build.to_json().items() if k != "training"})
    return build


def _save(build: FamilyBuild) -> None:
    (build.root / "build.json").write_text(json.dumps(build.to_json(), indent=2))


def family_size_mb(root: Path) -> float:
    """Total size of the model and tokenizer files under `root` (what would ship)."""
    names = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja"}  # fmt: skip
    total = sum(p.stat().st_size for p in root.rglob("*") if p.name in names)
    return round(total / 1e6, 2)
