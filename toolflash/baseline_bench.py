"""toolflash against the baseline its users would run instead: plain mlx-lm AR
(`mlx_lm.generate.generate_step`, what `mlx_lm.server` runs), side by side in one process.

Every variant decodes the same token ids of the same prompts on the same weights in the same
compute dtype (the engine's target model is the one mlx-lm runs), interleaved run by run, so
the ratios share the machine's state. Decode speed is measured the same way for every
variant, outside it: tokens after the first over the time from the first token's arrival to
the last's. Greedy outputs must equal mlx-lm's token for token; the report counts them.

Variants: `mlx-lm` (the 1.00x line), toolflash `ar`, `spec-fixed` and `spec-adaptive`
(speculation with a fixed block, and with the adaptive draft length), `policy-cold` (the
default adaptive policy as a first serve starts it, calibrated and nothing learned yet, fresh
for every request: what a first request meets) and `policy-warm` (one such policy across the
whole run, learning online, warmed by a pass over the prompts).
Stop modes: `eos` (natural end) and `length` (EOS ignored, exactly max_tokens).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tqdm import tqdm

from toolflash.bench import BenchPrompt, machine_info
from toolflash.engine.api import (
    FinishEvent,
    GenerationRequest,
    GenerationStats,
    Mode,
    ModeController,
)

StopMode = Literal["eos", "length"]
VARIANTS = (
    "mlx-lm",
    "ar",
    "lookup",
    "spec-fixed",
    "spec-adaptive",
    "policy-cold",
    "policy-warm",
)
BASELINE = "mlx-lm"
ALL_KINDS = "all"


@dataclass(frozen=True)
class Timed:
    """One run's output and its decode timing (measured the same way for every variant)."""

    tokens: list[int]
    decode_s: float  # first token's arrival -> last token's arrival
    cycles: int = 0  # toolflash: cycles and AR steps after the first token
    spec_cycles: int = 0
    spec_committed: int = 0

    @property
    def decode_tokens(self) -> int:
        return max(len(self.tokens) - 1, 0)


def mlx_lm_run(model: Any, prompt: Sequence[int], max_tokens: int, eos: frozenset[int]) -> Timed:
    """Plain mlx-lm greedy AR, stopping at the first of `eos` (kept, as the engine keeps it)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    tokens: list[int] = []
    first = last = 0.0
    for token, _ in generate_step(mx.array(list(prompt)), model, max_tokens=max_tokens):
        last = time.perf_counter()
        if not tokens:
            first = last
        tokens.append(int(token))
        if tokens[-1] in eos:
            break
    return Timed(tokens, last - first)


def toolflash_run(
    engine: Any, request: GenerationRequest, controller: ModeController | None = None
) -> Timed:
    """One generation through the engine's public `generate`, timed like `mlx_lm_run`."""
    tokens: list[int] = []
    first = last = 0.0
    stats: GenerationStats | None = None
    for event in engine.generate(request, controller=controller):
        if isinstance(event, FinishEvent):
            stats = event.stats
        elif event.token_ids:
            last = time.perf_counter()
            if not tokens:
                first = last
            tokens.extend(event.token_ids)
    assert stats is not None
    spec = [c for c in stats.cycles if c.speculative]
    return Timed(
        tokens,
        last - first,
        cycles=len(stats.cycles),
        spec_cycles=len(spec),
        spec_committed=sum(c.committed for c in spec),
    )


@dataclass(frozen=True)
class Case:
    """One prompt, ready to run: its kind, token ids and the policy's request class."""

    kind: str
    index: int
    ids: tuple[int, ...]
    request_class: Any  # toolflash.policy.request_class.RequestClass


def prepare_cases(engine: Any, prompts: Sequence[BenchPrompt]) -> list[Case]:
    """Render and tokenize every prompt as the server would, with the class it would get."""
    from toolflash.policy.request_class import classify

    cases = []
    for i, p in enumerate(prompts):
        ids = tuple(engine.encode_chat(p.messages, p.tools, p.template_kwargs))
        thinking = p.template_kwargs.get("enable_thinking")
        cls = classify(
            tools_offered=bool(p.tools),
            tool_choice="auto",
            response_format=None,
            enable_thinking=thinking if isinstance(thinking, bool) else None,
            last_role=str(p.messages[-1]["role"]),
            prompt_tokens=len(ids),
        )
        cases.append(Case(p.kind, i, ids, cls))
    return cases


@dataclass
class Runner:
    """Runs one variant on one case; holds what variants share (the warm policy)."""

    engine: Any
    max_tokens: int
    warm_policy: Any = None
    fresh_policy: Callable[[], Any] | None = None

    def run(self, variant: str, case: Case, stop: StopMode) -> Timed:
        if variant == BASELINE:
            eos = frozenset() if stop == "length" else self.engine.eos_ids
            return mlx_lm_run(self.engine.target.model, case.ids, self.max_tokens, eos)
        mode: Mode = variant if variant in ("ar", "lookup") else "spec"
        draft_length = {"spec-fixed": "fixed", "spec-adaptive": "adaptive"}.get(variant)
        request = GenerationRequest(
            prompt_tokens=case.ids,
            max_tokens=self.max_tokens,
            mode=mode,
            draft_length=draft_length,
            ignore_eos=stop == "length",
        )
        controller = None
        if variant.startswith("policy-"):
            policy = self.warm_policy if variant == "policy-warm" else self._fresh()
            controller = policy.controller_for(self.engine.model_id, case.request_class, False)
        return toolflash_run(self.engine, request, controller)

    def _fresh(self) -> Any:
        assert self.fresh_policy is not None
        return self.fresh_policy()


@dataclass
class Cell:
    """Runs of one variant for one (kind, stop), with the baseline's runs they pair with."""

    tokens: int = 0
    seconds: float = 0.0
    same: int = 0
    runs: int = 0
    cycles: int = 0
    spec_cycles: int = 0
    spec_committed: int = 0
    by_rep: dict[int, list[float]] = field(default_factory=dict)  # rep -> [tokens, seconds]

    def add(self, rep: int, t: Timed, same: bool) -> None:
        self.tokens += t.decode_tokens
        self.seconds += t.decode_s
        self.same += int(same)
        self.runs += 1
        self.cycles += t.cycles
        self.spec_cycles += t.spec_cycles
        self.spec_committed += t.spec_committed
        acc = self.by_rep.setdefault(rep, [0.0, 0.0])
        acc[0] += t.decode_tokens
        acc[1] += t.decode_s

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def rep_rates(self) -> dict[int, float]:
        return {r: (n / s if s > 0 else 0.0) for r, (n, s) in self.by_rep.items()}


def run_comparison(
    engine: Any,
    prompts: Sequence[BenchPrompt],
    *,
    max_tokens: int = 128,
    repeats: int = 3,
    stops: Sequence[StopMode] = ("eos", "length"),
    variants: Sequence[str] = VARIANTS,
    seed: int = 0,
    progress: bool = True,
    policy_factory: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Every variant on every prompt, `repeats` times per stop mode, interleaved (the order of
    variants is shuffled per prompt and repetition, seeded); a JSON-able report."""
    if BASELINE not in variants:
        variants = (BASELINE, *variants)
    if engine.drafter is None:
        variants = tuple(v for v in variants if v in (BASELINE, "ar", "lookup"))
    cases = prepare_cases(engine, prompts)
    runner = Runner(engine, max_tokens, fresh_policy=policy_factory)
    if any(v.startswith("policy-") for v in variants):
        runner.fresh_policy = policy_factory or calibrated_policies(engine, progress)
        runner.warm_policy = runner.fresh_policy()
    rng = random.Random(seed)
    for case in cases:  # warm-up: first-call compilation, allocator; warms the policy too
        for variant in variants:
            runner.run(variant, case, "eos")
    cells: dict[tuple[str, str, StopMode], Cell] = {}
    outputs_of: dict[int, list[int]] = {}  # a baseline output per case, for the phase split
    total = repeats * len(stops) * len(cases) * len(variants)
    t0 = time.perf_counter()
    with tqdm(
        total=total, file=sys.stderr, unit="run", desc="bench vs mlx-lm", disable=not progress
    ) as bar:
        for rep in range(repeats):
            for stop in stops:
                for case in cases:
                    order = list(variants)
                    rng.shuffle(order)
                    outputs = {}
                    for v in order:
                        outputs[v] = runner.run(v, case, stop)
                        bar.update()
                    base = outputs[BASELINE].tokens
                    outputs_of[case.index] = base
                    for v, t in outputs.items():
                        for kind in (case.kind, ALL_KINDS):
                            cells.setdefault((v, kind, stop), Cell()).add(rep, t, t.tokens == base)
    report = _report(
        engine, cells, variants, stops, cases, max_tokens, repeats, time.perf_counter() - t0
    )
    if "spec-fixed" in variants:
        report["phases"] = _phases(engine, cells, stops, cases, outputs_of)
    return report


def _phases(
    engine: Any,
    cells: Mapping[tuple[str, str, StopMode], Cell],
    stops: Sequence[StopMode],
    cases: Sequence[Case],
    outputs_of: Mapping[int, list[int]],
) -> list[dict[str, Any]]:
    """Per kind: the fixed-block spec cycle's wall time (decode time over cycles, so the
    engine loop between cycles counts) split into drafter forward, verify forward and the
    rest, the forwards timed alone at the kind's first prompt plus half its output."""
    from toolflash.cycle_phases import forward_costs, phase_split

    block = engine.default_block_size
    rows = []
    for kind in dict.fromkeys(c.kind for c in cases):
        case = next(c for c in cases if c.kind == kind)
        output = outputs_of.get(case.index, [])
        costs = forward_costs(engine, [*case.ids, *output[: len(output) // 2]], block)
        for stop in stops:
            cell = cells[("spec-fixed", kind, stop)]
            cycle_s = cell.seconds / cell.cycles if cell.cycles else 0.0
            rows.append(
                {
                    "kind": kind,
                    "stop": stop,
                    "block": block,
                    "cycle_ms": round(cycle_s * 1e3, 3),
                    "draft_ms": round(costs["draft_s"] * 1e3, 3),
                    "verify_ms": round(costs["verify_s"] * 1e3, 3),
                    **phase_split(cycle_s, costs),
                }
            )
    return rows


def calibrated_policies(
    engine: Any,
    progress: bool = True,
    policy_files: Sequence[str] = (),
    calibration_dir: str | None = None,
) -> Callable[[], Any]:
    """Fresh default policies (with `policy_files` applied after the shipped ones, as serve's
    --policy-config) as a server starts them on its first serve of this pair: calibrated once
    (`toolflash calibrate`, into `calibration_dir`, else a throwaway state directory), each
    loading the calibrated state and nothing learned since. A `calibration_dir` whose state
    holds estimates for the model already is reused as it is, even where a server would
    calibrate again (another tree's copy of the weights, other versions): calibrations differ
    from run to run (timings move with the machine, and a class's first choice with them), so
    runs compared on the cold policy, of one tree or of two, share one."""
    import tempfile
    from pathlib import Path

    from toolflash.calibrate import ensure_calibrated
    from toolflash.policy.adaptive import AdaptivePolicy
    from toolflash.policy.config import PolicyConfig
    from toolflash.policy.store import PolicyStore

    where = Path(calibration_dir or tempfile.mkdtemp(prefix="toolflash-bench-"))
    where.mkdir(parents=True, exist_ok=True)
    state = where / "policy-state.json"
    config = PolicyConfig(policy_files)
    if calibration_dir is None or not _holds_estimates(state, engine.model_id, config):
        ensure_calibrated(engine, AdaptivePolicy(config, state_file=str(state)), progress=progress)

    def fresh() -> Any:
        policy = AdaptivePolicy(config, persist=False)
        PolicyStore(state).load(engine.model_id, policy.model(engine.model_id).estimates)
        return policy

    return fresh


def _holds_estimates(state: Any, model_id: str, config: Any) -> bool:
    """Whether a policy state file holds estimates for the model."""
    from toolflash.policy.adaptive import AdaptivePolicy
    from toolflash.policy.store import PolicyStore

    estimates = AdaptivePolicy(config, persist=False).model(model_id).estimates
    return PolicyStore(state).load(model_id, estimates) > 0


def _report(
    engine: Any,
    cells: Mapping[tuple[str, str, StopMode], Cell],
    variants: Sequence[str],
    stops: Sequence[StopMode],
    cases: Sequence[Case],
    max_tokens: int,
    repeats: int,
    wall_s: float,
) -> dict[str, Any]:
    kinds = list(dict.fromkeys(c.kind for c in cases)) + [ALL_KINDS]
    rows = []
    for stop in stops:
        for kind in kinds:
            base = cells[(BASELINE, kind, stop)]
            base_reps = base.rep_rates()
            for v in variants:
                cell = cells[(v, kind, stop)]
                reps = cell.rep_rates()
                rep_ratios = [reps[r] / base_reps[r] for r in sorted(reps) if base_reps.get(r)]
                rows.append(
                    {
                        "stop": stop,
                        "kind": kind,
                        "variant": v,
                        "tok_s": round(cell.tok_s, 2),
                        "ratio": round(cell.tok_s / base.tok_s, 4) if base.tok_s else 0.0,
                        "rep_ratios": [round(r, 4) for r in rep_ratios],
                        "tokens_per_cycle": round(cell.tokens / cell.cycles, 3)
                        if cell.cycles
                        else (1.0 if v == BASELINE else 0.0),
                        "spec_tokens_per_cycle": round(cell.spec_committed / cell.spec_cycles, 3)
                        if cell.spec_cycles
                        else None,
                        "spec_share": round(cell.spec_committed / cell.tokens, 3)
                        if cell.tokens
                        else 0.0,
                        "identical": cell.same,
                        "runs": cell.runs,
                        "tokens": cell.tokens,
                    }
                )
    return {
        "model": engine.model_id,
        "draft": engine.draft_id,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "prompts": len(cases),
        "prompts_per_kind": {k: sum(1 for c in cases if c.kind == k) for k in kinds[:-1]},
        "variants": list(variants),
        "stops": list(stops),
        "machine": machine_info(),
        "wall_s": round(wall_s, 1),
        "rows": rows,
    }


def format_comparison(report: Mapping[str, Any]) -> str:
    """One table per stop mode: mlx-lm tok/s, then each variant's ratio (spread over
    repetitions in brackets), tokens per cycle and identical outputs."""
    variants = [v for v in report["variants"] if v != BASELINE]
    lines = [
        f"model={report['model']} draft={report['draft']} max_tokens={report['max_tokens']} "
        f"repeats={report['repeats']} device={report['machine']['device']} "
        f"blas={report['machine']['blas']}",
        "ratios to mlx-lm AR in the same run: pooled [min-max over repetitions]; "
        "tok/cyc = tokens per cycle or step; same = outputs identical to mlx-lm's",
    ]
    by = {(r["stop"], r["kind"], r["variant"]): r for r in report["rows"]}
    for stop in report["stops"]:
        lines += [
            "",
            f"stop={stop}",
            f"{'kind':<10} {'mlx-lm tok/s':>12} " + " ".join(f"{v:>24}" for v in variants),
        ]
        kinds = list(dict.fromkeys(r["kind"] for r in report["rows"] if r["stop"] == stop))
        for kind in kinds:
            base = by[(stop, kind, BASELINE)]
            cells = []
            for v in variants:
                r = by[(stop, kind, v)]
                spread = r["rep_ratios"]
                rng = f"[{min(spread):.2f}-{max(spread):.2f}]" if spread else ""
                cells.append(
                    f"{r['ratio']:.2f}x {rng} {r['tokens_per_cycle']:.1f} "
                    f"{r['identical']}/{r['runs']}"
                )
            lines.append(
                f"{kind:<10} {base['tok_s']:>12.1f} " + " ".join(f"{c:>24}" for c in cells)
            )
    lines.append("cell: ratio [spread] tok/cyc same/runs")
    if report.get("phases"):
        lines += [
            "",
            "spec-fixed cycle (wall, incl. the engine loop) vs its forwards timed alone:",
            f"{'kind':<10} {'stop':<7} {'block':>5} {'cycle ms':>9} {'draft':>14} "
            f"{'verify':>14} {'overhead':>9}",
        ]
        for r in report["phases"]:
            lines.append(
                f"{r['kind']:<10} {r['stop']:<7} {r['block']:>5} {r['cycle_ms']:>9.2f} "
                f"{r['draft_ms']:>6.2f} ({100 * r['draft']:>4.1f}%) "
                f"{r['verify_ms']:>6.2f} ({100 * r['verify']:>4.1f}%) "
                f"{100 * r['overhead']:>8.1f}%"
            )
    return "\n".join(lines)


def plot_comparison(report: Mapping[str, Any], path: str) -> bool:
    """A bar chart of the ratios per kind, one panel per stop mode (False without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    stops = report["stops"]
    variants = [v for v in report["variants"] if v != BASELINE]
    fig, axes = plt.subplots(1, len(stops), figsize=(6 * len(stops), 4), squeeze=False)
    for ax, stop in zip(axes[0], stops):
        rows = [r for r in report["rows"] if r["stop"] == stop]
        kinds = list(dict.fromkeys(r["kind"] for r in rows))
        width = 0.8 / len(variants)
        for j, v in enumerate(variants):
            vals = [
                next(r["ratio"] for r in rows if r["kind"] == k and r["variant"] == v)
                for k in kinds
            ]
            ax.bar([i + j * width for i in range(len(kinds))], vals, width, label=v)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))], kinds)
        ax.set_ylabel("decode tok/s / mlx-lm AR")
        ax.set_title(f"{report['model']} (stop={stop})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
