"""Measure a trained drafter with the real draft-verify loop (never from training accuracy).

For every held-out prompt: a target-only greedy run (the reference) and a speculative run with
the drafter; the speculative output must equal the reference (lossless at temperature 0).
Reported per prompt kind: tokens per cycle (tau = committed tokens / spec cycles), acceptance
by position (share of cycles whose draft was accepted through block slot k), the histogram of
accepted lengths, and decode tokens/s of both runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm import tqdm

from toolflash.engine.api import CycleRecord
from toolflash.engine.drafter import DFlashDrafter
from toolflash.engine.targets.base import TargetAdapter

from .data import PromptRecord, as_records
from .generation import generate


@dataclass(frozen=True)
class PromptEval:
    """One held-out prompt, run target-only and speculatively."""

    kind: str
    prompt_len: int
    output_len: int
    lossless: bool
    cycles: int
    committed: int
    accepted: list[int]  # accepted draft length per spec cycle
    ar_s: float
    spec_s: float


@dataclass
class KindReport:
    """Aggregates over the prompts of one kind (or all: kind "all")."""

    kind: str
    prompts: int
    lossless: int
    cycles: int
    tokens: int
    tokens_per_cycle: float
    acceptance_by_position: list[float]
    accepted_histogram: list[int]
    ar_tokens_per_s: float
    spec_tokens_per_s: float


@dataclass
class EvalReport:
    """The real-loop evaluation of a drafter."""

    block_size: int
    max_new_tokens: int
    kinds: dict[str, KindReport] = field(default_factory=dict)
    prompts: list[PromptEval] = field(default_factory=list)

    @property
    def lossless(self) -> bool:
        return all(p.lossless for p in self.prompts)

    @property
    def overall(self) -> KindReport:
        return aggregate("all", self.prompts, self.block_size)

    def to_dict(self) -> dict[str, object]:
        return {
            "block_size": self.block_size,
            "max_new_tokens": self.max_new_tokens,
            "lossless": self.lossless,
            "overall": asdict(self.overall),
            "kinds": {k: asdict(v) for k, v in self.kinds.items()},
        }


def aggregate(kind: str, prompts: Sequence[PromptEval], block_size: int) -> KindReport:
    """Pool the cycles of `prompts`."""
    accepted = [a for p in prompts for a in p.accepted]
    cycles = len(accepted)
    committed = sum(p.committed for p in prompts)
    hist = np.bincount(np.array(accepted, dtype=np.int64), minlength=block_size)[:block_size]
    by_pos = [
        float(np.mean([a >= k for a in accepted])) if accepted else 0.0
        for k in range(1, block_size)
    ]
    tokens = sum(p.output_len for p in prompts)
    ar_s = sum(p.ar_s for p in prompts)
    spec_s = sum(p.spec_s for p in prompts)
    return KindReport(
        kind=kind,
        prompts=len(prompts),
        lossless=sum(p.lossless for p in prompts),
        cycles=cycles,
        tokens=tokens,
        tokens_per_cycle=committed / cycles if cycles else 0.0,
        acceptance_by_position=[round(x, 4) for x in by_pos],
        accepted_histogram=[int(x) for x in hist],
        ar_tokens_per_s=tokens / ar_s if ar_s > 0 else 0.0,
        spec_tokens_per_s=tokens / spec_s if spec_s > 0 else 0.0,
    )


def _spec_cycles(cycles: Sequence[CycleRecord]) -> list[CycleRecord]:
    return [c for c in cycles if c.mode == "spec"]


def evaluate_drafter(
    target: TargetAdapter,
    drafter: DFlashDrafter,
    prompts: Sequence[PromptRecord | Sequence[int]],
    stop_ids: Iterable[int],
    max_new_tokens: int = 128,
    block_size: int | None = None,
    progress: bool = True,
) -> EvalReport:
    """Run every prompt target-only and speculatively; compare outputs and pool the cycles."""
    stops = set(stop_ids)
    bs = block_size or drafter.config.block_size
    report = EvalReport(block_size=bs, max_new_tokens=max_new_tokens)
    for record in tqdm(as_records(prompts), desc="eval", unit="prompt", disable=not progress):
        ar = generate(target, record.tokens, max_new_tokens, stops)
        spec = generate(
            target, record.tokens, max_new_tokens, stops, drafter, mode="spec", block_size=bs
        )
        cycles = _spec_cycles(spec.cycles)
        report.prompts.append(
            PromptEval(
                kind=record.kind,
                prompt_len=len(record.tokens),
                output_len=len(ar.output),
                lossless=spec.output == ar.output,
                cycles=len(cycles),
                committed=sum(c.committed for c in cycles),
                accepted=[c.accepted for c in cycles],
                ar_s=ar.decode_s,
                spec_s=spec.decode_s,
            )
        )
    for kind in sorted({p.kind for p in report.prompts}):
        report.kinds[kind] = aggregate(kind, [p for p in report.prompts if p.kind == kind], bs)
    return report


def format_report(report: EvalReport) -> str:
    """A printable table: tau, acceptance by position and speeds per kind."""
    lines = [
        f"real draft-verify loop, greedy, block {report.block_size}, "
        f"<= {report.max_new_tokens} new tokens per prompt",
        f"{'kind':<10} {'prompts':>7} {'cycles':>6} {'tau':>6} {'ar tok/s':>9} "
        f"{'spec tok/s':>10}  acceptance by position (k=1..)",
    ]
    rows = [*report.kinds.values(), report.overall]
    for r in rows:
        by_pos = " ".join(f"{x:.2f}" for x in r.acceptance_by_position)
        lines.append(
            f"{r.kind:<10} {r.prompts:>7} {r.cycles:>6} {r.tokens_per_cycle:>6.2f} "
            f"{r.ar_tokens_per_s:>9.1f} {r.spec_tokens_per_s:>10.1f}  {by_pos}"
        )
    bad = [i for i, p in enumerate(report.prompts) if not p.lossless]
    lines.append(
        "lossless: spec output == target-only output on all prompts"
        if not bad
        else f"NOT LOSSLESS on prompts {bad}"
    )
    return "\n".join(lines)
