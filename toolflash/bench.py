"""Speculative vs target-only decoding, side by side in one process, per prompt kind.

For every prompt both modes run on the same engine (alternating, after a warm-up), so the
ratio is measured under the same conditions. Reports decode tok/s per mode, the speedup,
tokens per cycle, acceptance by block position, the phase split of speculative cycles, and
whether speculative output equalled AR output token for token (the lossless contract).

With several temperatures every prompt runs at each of them in the same process: greedy
(temperature 0) must be token-identical across modes; sampled runs use exact speculative
sampling (same distribution, not the same tokens), seeded so a run can be repeated.

The ratio is speculative decoding against toolflash's own AR decoding, not against plain
mlx-lm (that is `toolflash bench --baseline mlx-lm`, `toolflash/baseline_bench.py`).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from toolflash.engine.api import (
    DEFAULT_DRAFT_LENGTH,
    DraftLength,
    Engine,
    FinishEvent,
    GenerationRequest,
    GenerationStats,
    Mode,
    SamplingParams,
)


@dataclass(frozen=True)
class BenchPrompt:
    """One chat prompt of a kind (free_text, code, tool_call, json)."""

    kind: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class KindResult:
    """Aggregated figures for one prompt kind."""

    kind: str
    prompts: int
    temperature: float
    draft_length: str  # adaptive | fixed (engine/draft_length.py)
    ar_tok_s: float
    spec_tok_s: float
    speedup: float
    pooled_speedup: float  # all tokens over all decode time per mode: long outputs weigh more
    tokens_per_cycle: float
    acceptance_by_pos: list[float]
    phase_split: dict[str, float]
    mean_prompt_tokens: float
    mean_output_tokens: float
    lossless: bool | None  # spec == AR token for token; None for sampled runs


def _run(
    engine: Engine,
    prompt: list[int],
    mode: Mode,
    max_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    draft_length: DraftLength | None = None,
) -> tuple[list[int], GenerationStats]:
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=max_tokens,
        mode=mode,
        sampling=sampling,
        draft_length=draft_length,
    )
    tokens: list[int] = []
    stats = None
    for event in engine.generate(request):
        if isinstance(event, FinishEvent):
            stats = event.stats
        else:
            tokens.extend(event.token_ids)
    assert stats is not None
    return tokens, stats


def bench_kind(
    engine: Engine,
    kind: str,
    prompts: Sequence[BenchPrompt],
    max_tokens: int,
    repeats: int,
    temperature: float = 0.0,
    seed: int = 0,
    draft_lengths: Sequence[DraftLength] = (DEFAULT_DRAFT_LENGTH,),
    on_run: Callable[[], object] = lambda: None,
) -> list[KindResult]:
    """Run every prompt of one kind at `temperature`: AR, then spec once per draft length,
    back to back; one result per draft length (the AR runs are shared), with medians of
    per-run decode speed and the pooled ratio. Sampled runs take seeds seed, seed+1, ...
    (one per run). `on_run` is called after each measured run (a progress bar)."""
    ar_speeds: list[float] = []
    ar_pooled = [0.0, 0.0]  # tokens, decode seconds
    spec: dict[DraftLength, _SpecRuns] = {d: _SpecRuns() for d in draft_lengths}
    prompt_lens, out_lens = [], []
    for p in prompts:
        ids = engine.encode_chat(p.messages, p.tools, p.template_kwargs)
        prompt_lens.append(len(ids))
        _run(engine, ids, "ar", 8)  # warm-up: first-call compilation, allocator
        for _ in range(repeats):
            sampling = SamplingParams(temperature=temperature, seed=seed)
            seed += 1
            ar_tokens, ar = _run(engine, ids, "ar", max_tokens, sampling)
            on_run()
            ar_speeds.append(ar.decode_tokens_per_s)
            ar_pooled[0] += ar.completion_tokens
            ar_pooled[1] += ar.decode_s
            out_lens.append(len(ar_tokens))
            for draft_length, runs in spec.items():
                tokens, stats = _run(engine, ids, "spec", max_tokens, sampling, draft_length)
                runs.add(tokens == ar_tokens, stats)
                on_run()
    ar_med = statistics.median(ar_speeds)
    return [
        runs.result(
            kind,
            len(prompts),
            temperature,
            draft_length,
            ar_med,
            _pooled_ratio(runs.pooled, ar_pooled),
            statistics.mean(prompt_lens),
            statistics.mean(out_lens) if out_lens else 0.0,
        )
        for draft_length, runs in spec.items()
    ]


@dataclass
class _SpecRuns:
    """The speculative runs of one kind at one draft length."""

    speeds: list[float] = field(default_factory=list)
    stats: list[GenerationStats] = field(default_factory=list)
    pooled: list[float] = field(default_factory=lambda: [0.0, 0.0])  # tokens, decode seconds
    lossless: bool = True

    def add(self, same_as_ar: bool, stats: GenerationStats) -> None:
        self.lossless &= same_as_ar
        self.speeds.append(stats.decode_tokens_per_s)
        self.stats.append(stats)
        self.pooled[0] += stats.completion_tokens
        self.pooled[1] += stats.decode_s

    def result(
        self,
        kind: str,
        prompts: int,
        temperature: float,
        draft_length: str,
        ar_med: float,
        pooled_speedup: float,
        mean_prompt: float,
        mean_out: float,
    ) -> KindResult:
        spec_med = statistics.median(self.speeds)
        cycles = [c for s in self.stats for c in s.cycles if c.mode == "spec"]
        block = max((c.block_size for c in cycles), default=1)
        by_pos = [
            sum(1 for c in cycles if c.accepted >= k) / len(cycles) if cycles else 0.0
            for k in range(1, block)
        ]
        phase_total = sum(c.total_s for c in cycles) or 1.0
        return KindResult(
            kind=kind,
            prompts=prompts,
            temperature=temperature,
            draft_length=draft_length,
            ar_tok_s=ar_med,
            spec_tok_s=spec_med,
            speedup=spec_med / ar_med if ar_med else 0.0,
            pooled_speedup=pooled_speedup,
            tokens_per_cycle=sum(c.committed for c in cycles) / len(cycles) if cycles else 0.0,
            acceptance_by_pos=[round(x, 3) for x in by_pos],
            phase_split={
                "draft": sum(c.draft_s for c in cycles) / phase_total,
                "verify": sum(c.verify_s for c in cycles) / phase_total,
                "rollback": sum(c.rollback_s for c in cycles) / phase_total,
            },
            mean_prompt_tokens=mean_prompt,
            mean_output_tokens=mean_out,
            lossless=self.lossless if temperature == 0 else None,
        )


def _pooled_ratio(spec: list[float], ar: list[float]) -> float:
    spec_rate = spec[0] / spec[1] if spec[1] > 0 else 0.0
    ar_rate = ar[0] / ar[1] if ar[1] > 0 else 0.0
    return spec_rate / ar_rate if ar_rate else 0.0


def run_benchmark(
    engine: Engine,
    prompts: Sequence[BenchPrompt],
    max_tokens: int = 256,
    repeats: int = 1,
    temperatures: Sequence[float] = (0.0,),
    seed: int = 0,
    draft_lengths: Sequence[DraftLength] = (DEFAULT_DRAFT_LENGTH,),
    progress: bool = False,
) -> dict[str, Any]:
    """All kinds at every temperature and draft length; returns a JSON-able report with
    versions and machine. `progress`: a bar on stderr, one step per measured run."""
    from tqdm import tqdm

    kinds: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        kinds.setdefault(p.kind, []).append(p)
    t0 = time.perf_counter()
    total = len(prompts) * len(temperatures) * repeats * (1 + len(draft_lengths))
    with tqdm(total=total, unit="run", desc="bench", disable=not progress) as bar:
        results = [
            r
            for k, ps in kinds.items()
            for t in temperatures
            for r in bench_kind(
                engine, k, ps, max_tokens, repeats, t, seed, draft_lengths, bar.update
            )
        ]
    return {
        "model": engine.model_id,
        "draft": engine.draft_id,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "temperatures": list(temperatures),
        "draft_lengths": list(draft_lengths),
        "seed": seed,
        "machine": machine_info(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "kinds": [asdict(r) for r in results],
    }


def machine_info() -> dict[str, Any]:
    import mlx.core as mx

    from toolflash.blas import blas_in_use

    info: Mapping[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "mlx": getattr(mx, "__version__", "?"),
        "device": str(mx.default_device()),
        "blas": str(blas_in_use()),
    }
    return dict(info)


def format_report(report: Mapping[str, Any]) -> str:
    """A fixed-width table of the report."""
    lines = [
        describe(report),
        f"model={report['model']} draft={report['draft']} max_tokens={report['max_tokens']} "
        f"device={report['machine']['device']} blas={report['machine']['blas']}",
        f"{'kind':<10} {'temp':>5} {'draft':>8} {'AR tok/s':>9} {'spec tok/s':>10} {'speedup':>8} "
        f"{'pooled':>7} {'tok/cycle':>9} {'draft%':>7} {'verify%':>8} {'rollb%':>7} "
        f"{'prompt':>7} {'out':>5} lossless",
    ]
    for r in report["kinds"]:
        ph = r["phase_split"]
        lossless = "-" if r["lossless"] is None else str(r["lossless"])
        lines.append(
            f"{r['kind']:<10} {r['temperature']:>5.2f} {r.get('draft_length', 'fixed'):>8} "
            f"{r['ar_tok_s']:>9.1f} {r['spec_tok_s']:>10.1f} "
            f"{r['speedup']:>7.2f}x {r['pooled_speedup']:>6.2f}x {r['tokens_per_cycle']:>9.2f} "
            f"{100 * ph['draft']:>6.1f}% "
            f"{100 * ph['verify']:>7.1f}% {100 * ph['rollback']:>6.1f}% "
            f"{r['mean_prompt_tokens']:>7.0f} {r['mean_output_tokens']:>5.0f} {lossless}"
        )
    temps = sorted({r["temperature"] for r in report["kinds"]})
    if len(temps) > 1:
        lines += ["", "tokens per cycle / speedup vs AR, by temperature:"]
        lines.append(f"{'kind':<10} " + " ".join(f"{'T=' + format(t, 'g'):>15}" for t in temps))
        first = report["kinds"][0].get("draft_length")
        by = {
            (r["kind"], r["temperature"]): r
            for r in report["kinds"]
            if r.get("draft_length") == first
        }
        for kind in dict.fromkeys(r["kind"] for r in report["kinds"]):
            cells = [
                f"{by[kind, t]['tokens_per_cycle']:>6.2f} / {by[kind, t]['speedup']:>5.2f}x"
                for t in temps
            ]
            lines.append(f"{kind:<10} " + " ".join(f"{c:>15}" for c in cells))
    return "\n".join(lines)


def describe(report: Mapping[str, Any]) -> str:
    """What the run measured, in one line (the table's ratios are to toolflash's own AR)."""
    per_kind = max((r["prompts"] for r in report["kinds"]), default=0)
    return (
        f"speculative vs toolflash's own AR decoding, {per_kind} prompts per kind, "
        f"{report['max_tokens']} new tokens, {report['repeats']} repetition(s), side by side "
        "in one process (against plain mlx-lm: --baseline mlx-lm)"
    )


def load_prompts(path: str) -> list[BenchPrompt]:
    """Prompts from a JSONL file of chat requests with a kind:
    {"kind", "messages", "tools"?, "chat_template_kwargs"?}."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append(
                    BenchPrompt(
                        kind=d["kind"],
                        messages=d["messages"],
                        tools=d.get("tools"),
                        template_kwargs=d.get("chat_template_kwargs") or {},
                    )
                )
    return out
