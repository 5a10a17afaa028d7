"""Build the tiny model family from a recipe: corpus -> tokenizer -> targets -> drafters.

`build_family` runs every stage a `FamilyRecipe` names, timing each, and returns a
`FamilyBuild` naming every directory it wrote; `build.json` beside them holds the same summary
(with the recipe), rewritten after each stage so an interrupted build shows how far it got.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from toolflash.zoo.corpus import build_corpus, record_size
from toolflash.zoo.drafters import DRAFTER_SUFFIX, build_drafter, write_drafter_prompts
from toolflash.zoo.recipes import CPU, FamilyRecipe
from toolflash.zoo.records import Record
from toolflash.zoo.target_configs import DIR_NAMES
from toolflash.zoo.tokenizer import build_tokenizer
from toolflash.zoo.train_target import TrainResult, tokenize_corpus, train_target

log = structlog.get_logger(__name__)


@dataclass
class FamilyBuild:
    """Where the family landed and what each stage cost."""

    root: Path
    seed: int
    recipe: FamilyRecipe
    tokenizer_dir: Path
    target_dirs: dict[str, Path] = field(default_factory=dict)
    drafter_dirs: dict[str, Path] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    training: dict[str, TrainResult] = field(default_factory=dict)
    drafters: dict[str, dict[str, Any]] = field(default_factory=dict)
    corpus_records: int = 0
    corpus_bytes: int = 0
    corpus_tokens: int = 0
    corpus_digest: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "seed": self.seed,
            "recipe": self.recipe.to_json(),
            "corpus_records": self.corpus_records,
            "corpus_bytes": self.corpus_bytes,
            "corpus_tokens": self.corpus_tokens,
            "corpus_digest": self.corpus_digest,
            "tokenizer_dir": str(self.tokenizer_dir),
            "target_dirs": {k: str(v) for k, v in self.target_dirs.items()},
            "drafter_dirs": {k: str(v) for k, v in self.drafter_dirs.items()},
            "stage_seconds": self.stage_seconds,
            "total_seconds": round(sum(self.stage_seconds.values()), 1),
            "training": {k: asdict(v) for k, v in self.training.items()},
            "drafters": self.drafters,
        }


def write_corpus(records: Sequence[Record], path: Path) -> None:
    """Save the records as JSON lines (for inspection and for drafter prompt extraction)."""
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")


def build_family(out: Path, recipe: FamilyRecipe = CPU, seed: int = 0) -> FamilyBuild:
    """Build every stage of `recipe` under `out`; returns what it wrote.

    `out/tokenizer` holds the tokenizer, `out/qwen3-tiny` and `out/qwen35-tiny` the targets and
    `out/<target>-dflash` their drafters (each directory self-contained, loadable as the
    embedded family is), `out/corpus.jsonl` the records, `out/prompts_*.jsonl` the drafters'
    distillation and evaluation prompts, and `out/build.json` this summary.
    """
    out.mkdir(parents=True, exist_ok=True)
    build = FamilyBuild(root=out, seed=seed, recipe=recipe, tokenizer_dir=out / "tokenizer")
    log.info("zoo.build.start", out=str(out), seed=seed, recipe=recipe.name)

    with _stage(build, "corpus"):
        records = build_corpus(seed, recipe.corpus_size)
        write_corpus(records, out / "corpus.jsonl")
        build.corpus_records = len(records)
        build.corpus_bytes = sum(record_size(r) for r in records)
    with _stage(build, "tokenizer"):
        build_tokenizer(records, build.tokenizer_dir)
    with _stage(build, "tokenize"):
        stream, digest = tokenize_corpus(records, build.tokenizer_dir)
        build.corpus_tokens, build.corpus_digest = int(len(stream)), digest

    for family, target in recipe.targets.items():
        target_dir = out / DIR_NAMES[family]
        with _stage(build, f"train_{family}"):
            build.training[family] = train_target(
                family,
                records,
                build.tokenizer_dir,
                target_dir,
                steps=target.steps,
                seed=seed,
                batch_size=target.batch_size,
                seq_len=target.seq_len,
                lr=target.lr,
                stream=stream,
                stream_digest=digest,
                config_overrides=dict(target.config_overrides) or None,
            )
        build.target_dirs[family] = target_dir

    for family, drafter in recipe.drafters.items():
        target_dir = build.target_dirs[family]
        with _stage(build, f"prompts_{family}"):
            prompt_files = write_drafter_prompts(
                drafter, records, build.tokenizer_dir, out, family, seed
            )
        drafter_dir = target_dir.parent / f"{target_dir.name}{DRAFTER_SUFFIX}"
        with _stage(build, f"drafter_{family}"):
            build.drafters[family] = build_drafter(
                drafter, target_dir, drafter_dir, prompt_files, seed
            )
        build.drafter_dirs[family] = drafter_dir
    log.info("zoo.build.done", out=str(out), stage_seconds=build.stage_seconds)
    return build


@contextmanager
def _stage(build: FamilyBuild, name: str) -> Iterator[None]:
    """Time one stage into `build.stage_seconds` and rewrite build.json after it."""
    t0 = time.perf_counter()
    yield
    build.stage_seconds[name] = round(time.perf_counter() - t0, 1)
    _save(build)


def _save(build: FamilyBuild) -> None:
    (build.root / "build.json").write_text(json.dumps(build.to_json(), indent=2))


def family_size_mb(root: Path) -> float:
    """Total size of the model and tokenizer files under `root` (what would ship)."""
    names = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja"}  # fmt: skip
    total = sum(p.stat().st_size for p in root.rglob("*") if p.name in names)
    return round(total / 1e6, 2)
