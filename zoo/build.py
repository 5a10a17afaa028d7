"""Build the tiny model family from a recipe: corpus -> tokenizer -> targets -> drafters.

`build_family` runs every stage a `FamilyRecipe` names, timing each, and returns a
`FamilyBuild` naming every directory it wrote; `build.json` beside them holds the same summary
(with the recipe), rewritten after each stage so an interrupted build shows how far it got.

After the shared stages (corpus, tokenizer, tokenization) each family's own stages (target,
prompt files, drafter) depend on nothing but the shared files, the recipe and the seed, so
`jobs` > 1 runs the families in parallel worker processes, each with its share of the BLAS
threads: MLX runs most non-matmul work of a training step on one thread, so on 2 cores two
single-threaded builds finish sooner than two sequential two-threaded ones.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from toolflash.zoo.corpus import build_corpus, record_size
from toolflash.zoo.drafters import DRAFTER_SUFFIX, build_drafter, write_drafter_prompts
from toolflash.zoo.manifest import family_files
from toolflash.zoo.recipes import CPU, DrafterRecipe, FamilyRecipe, TargetRecipe
from toolflash.zoo.records import Record
from toolflash.zoo.target_configs import DIR_NAMES, Family
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
    jobs: int = 1
    wall_seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)  # `manifest.family_files`, at the end

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
            # Stages of different families overlap when jobs > 1: the wall time is the cost.
            "total_seconds": round(sum(self.stage_seconds.values()), 1),
            "jobs": self.jobs,
            "wall_seconds": self.wall_seconds,
            "training": {k: asdict(v) for k, v in self.training.items()},
            "drafters": self.drafters,
            "files": self.files,
        }


def write_corpus(records: Sequence[Record], path: Path) -> None:
    """Save the records as JSON lines (for inspection and for drafter prompt extraction)."""
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")


@dataclass(frozen=True)
class MemberJob:
    """One family's own stages: its target, then (if the recipe has one) its drafter."""

    family: Family
    target: TargetRecipe
    drafter: DrafterRecipe | None
    out: Path
    tokenizer_dir: Path
    seed: int
    progress: bool = True


@dataclass
class MemberResult:
    """What one family's stages wrote, and their wall times."""

    family: Family
    target_dir: Path
    training: TrainResult
    stage_seconds: dict[str, float]
    drafter_dir: Path | None = None
    drafter: dict[str, Any] | None = None


def default_jobs(families: int) -> int:
    """One worker per family, at most one per CPU core."""
    return max(1, min(families, os.cpu_count() or 1))


def build_family(
    out: Path,
    recipe: FamilyRecipe = CPU,
    seed: int = 0,
    jobs: int | None = None,
    progress: bool = False,
) -> FamilyBuild:
    """Build every stage of `recipe` under `out`; returns what it wrote.

    `out/tokenizer` holds the tokenizer, `out/qwen3-tiny` and `out/qwen35-tiny` the targets and
    `out/<target>-dflash` their drafters (each directory self-contained, loadable as the
    embedded family is), `out/corpus.jsonl` the records, `out/prompts_*.jsonl` the drafters'
    distillation and evaluation prompts, and `out/build.json` this summary. `jobs` worker
    processes build the families (default `default_jobs`); 1 builds them one after the other
    in this process. `progress`: a bar on stderr over the shared stages and the families (each
    family's target, prompts and drafter are one step: they run in a worker).
    """
    from tqdm import tqdm

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    build = FamilyBuild(root=out, seed=seed, recipe=recipe, tokenizer_dir=out / "tokenizer")
    members = [
        MemberJob(family, target, recipe.drafters.get(family), out, build.tokenizer_dir, seed)
        for family, target in recipe.targets.items()
    ]
    build.jobs = min(len(members), default_jobs(len(members)) if jobs is None else jobs) or 1
    log.info("zoo.build.start", out=str(out), seed=seed, recipe=recipe.name, jobs=build.jobs)

    bar = tqdm(total=3 + len(members), desc="zoo build: corpus", disable=not progress)
    with bar:
        with _stage(build, "corpus", bar):
            records = build_corpus(seed, recipe.corpus_size)
            write_corpus(records, out / "corpus.jsonl")
            build.corpus_records = len(records)
            build.corpus_bytes = sum(record_size(r) for r in records)
        bar.set_description("zoo build: tokenizer")
        with _stage(build, "tokenizer", bar):
            build_tokenizer(records, build.tokenizer_dir)
        bar.set_description("zoo build: tokenize")
        with _stage(build, "tokenize", bar):
            stream, digest = tokenize_corpus(records, build.tokenizer_dir)
            build.corpus_tokens, build.corpus_digest = int(len(stream)), digest
        bar.set_description(f"zoo build: {len(members)} families, {build.jobs} worker(s)")
        for result in _run_members(members, records, stream, digest, build.jobs):
            build.target_dirs[result.family] = result.target_dir
            build.training[result.family] = result.training
            if result.drafter_dir is not None and result.drafter is not None:
                build.drafter_dirs[result.family] = result.drafter_dir
                build.drafters[result.family] = result.drafter
            build.stage_seconds.update(result.stage_seconds)
            build.wall_seconds = round(time.perf_counter() - start, 1)
            _save(build)
            bar.update()
    build.wall_seconds = round(time.perf_counter() - start, 1)
    build.files = family_files(out)
    _save(build)
    log.info("zoo.build.done", out=str(out), wall_s=build.wall_seconds, stages=build.stage_seconds)
    return build


def build_member(
    job: MemberJob, records: Sequence[Record], stream: np.ndarray, digest: str
) -> MemberResult:
    """Train `job`'s target on the tokenized corpus, then write its prompt files and build its
    drafter; every stage timed."""
    family = job.family
    seconds: dict[str, float] = {}
    target_dir = job.out / DIR_NAMES[family]
    with _timed(seconds, f"train_{family}"):
        training = train_target(
            family,
            records,
            job.tokenizer_dir,
            target_dir,
            steps=job.target.steps,
            seed=job.seed,
            batch_size=job.target.batch_size,
            seq_len=job.target.seq_len,
            lr=job.target.lr,
            stream=stream,
            stream_digest=digest,
            config_overrides=dict(job.target.config_overrides) or None,
        )
    result = MemberResult(family, target_dir, training, seconds)
    if job.drafter is None:
        return result
    with _timed(seconds, f"prompts_{family}"):
        prompt_files = write_drafter_prompts(
            job.drafter, records, job.tokenizer_dir, job.out, family, job.seed
        )
    result.drafter_dir = target_dir.parent / f"{target_dir.name}{DRAFTER_SUFFIX}"
    with _timed(seconds, f"drafter_{family}"):
        result.drafter = build_drafter(
            job.drafter, target_dir, result.drafter_dir, prompt_files, job.seed, job.progress
        )
    return result


def _run_members(
    members: Sequence[MemberJob],
    records: Sequence[Record],
    stream: np.ndarray,
    digest: str,
    jobs: int,
) -> Iterator[MemberResult]:
    """Each member's result as it finishes: in this process one after the other, or in `jobs`
    spawned workers that split the CPU cores' BLAS threads between them."""
    if jobs <= 1:
        for member in members:
            yield build_member(member, records, stream, digest)
        return
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    saved = {k: os.environ.get(k) for k in _BLAS_THREAD_VARS}
    # Read by OpenBLAS when a worker loads it, so set before the workers start (spawned
    # workers copy this process's environment).
    os.environ.update(dict.fromkeys(_BLAS_THREAD_VARS, threads))
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_logs) as pool:
            quiet = [replace(m, progress=False) for m in members]  # no interleaved bars
            futures = [pool.submit(build_member, m, records, stream, digest) for m in quiet]
            for future in as_completed(futures):
                yield future.result()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def _worker_logs() -> None:
    from toolflash.gateway.logs import configure_logging

    configure_logging(json_lines=False, level=os.environ.get("TOOLFLASH_LOG_LEVEL", "info"))


@contextmanager
def _timed(seconds: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    seconds[name] = round(time.perf_counter() - t0, 1)


@contextmanager
def _stage(build: FamilyBuild, name: str, bar: Any) -> Iterator[None]:
    """Time one shared stage into `build.stage_seconds`, rewrite build.json and step the
    progress bar after it."""
    with _timed(build.stage_seconds, name):
        yield
    _save(build)
    bar.update()


def _save(build: FamilyBuild) -> None:
    (build.root / "build.json").write_text(json.dumps(build.to_json(), indent=2))
