"""Calibration: measure this machine and pair once, and seed the adaptive policy with it.

The policy learns spec vs AR online, so a fresh server used to decide its first requests from
no data (it ran JSON requests of one pair in AR at 0.66x where spec gave 1.14x). Calibration
runs a short, fixed set of generations through the engine's public surface, each a chat
request rendered by the gateway's own path (so it lands in the request class a client's
request would), with one arm scripted throughout (`policy.measure.ScriptedController`):
- per request kind (`calibration_requests.py`: free chat, tools offered after a user turn
  and after a tool result, a forced tool call, a JSON schema answer), as the prompts come and
  with the template's thinking default: AR, spec at the largest block, giving the drafter's
  tokens per cycle per class and span (smaller blocks are credited from the same cycles) and
  the forced-run shares of constrained classes, and lookup (its tokens and seconds per step,
  which seed the span's pool: a prior, as the built-in prompts only guess at what a class's
  outputs copy); a pair without a drafter runs AR and lookup only;
- at a few context lengths: AR steps and spec cycles at every block size of the policy.
Every cycle drafts the whole block (`draft_length="fixed"`), so a block's cycle time is
measured at that block. The steps feed a fresh `Estimates` by the rule online learning uses;
`policy.calibration.seed` merges them into the policy's estimates, which the `PolicyStore`
saves, and a record keyed by model, weights, machine and versions (`calibration_key.py`)
says it ran.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from toolflash.calibration_key import calibration_key
from toolflash.calibration_requests import class_bodies, long_body
from toolflash.engine.api import Engine, FinishEvent, GenerationRequest
from toolflash.engine.lookup import LookupConfig
from toolflash.gateway.worker import Prepared
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.calibration import (
    CalibrationRecord,
    load_record,
    save_record,
    seed,
)
from toolflash.policy.config import EffectivePolicy
from toolflash.policy.decide import Arm, arm_name
from toolflash.policy.estimates import Estimates
from toolflash.policy.measure import ScriptedController
from toolflash.policy.spans import SPAN_KINDS

log = structlog.get_logger(__name__)

AR: Arm = ("ar", 1)


@dataclass(frozen=True)
class CalibrationPlan:
    """What calibration runs (every setting declared here once)."""

    prompts_per_kind: int = 3  # prompts of each request kind
    max_tokens: int = 80  # output tokens per class run
    thinking_default: bool = True  # also each prompt with the template's thinking default
    contexts: tuple[int, ...] = (1024, 4096)  # prompt lengths of the timing runs (+ the shortest)
    timing_cycles: int = 12  # spec cycles per block size per context (tokens: cycles x block)
    timing_steps: int = 32  # AR steps per context
    # Effective samples each seeded estimate keeps (`policy.calibration.seed`): timings are
    # this machine's (own samples); tokens per cycle only a guess at the workload's (a prior
    # per class, like the pooled ones) and forced-run shares likewise (own, lightly).
    timing_weight: float = 8.0
    tau_weight: float = 2.0


@dataclass(frozen=True)
class Run:
    """One scripted generation: the arm it runs and its output budget; `timing` runs measure
    a context length rather than a class."""

    kind: str
    arm: Arm
    max_tokens: int
    timing: bool = False


# -- running ------------------------------------------------------------------------------------
def _prepare(engine: Engine, body: Mapping[str, Any]) -> Prepared:
    """The gateway's own preparation of a chat request: rendered, classified, constrained."""
    from toolflash.gateway.config import GatewayConfig
    from toolflash.gateway.dialects.openai_request import chat_request
    from toolflash.gateway.prepare import prepare_now
    from toolflash.gateway.protocol import ChatCompletionRequest

    req = chat_request(ChatCompletionRequest.model_validate(dict(body)))
    return prepare_now(req, engine, GatewayConfig(), "calibration")


def _generate(engine: Engine, request: GenerationRequest, controller: Any = None) -> int:
    """Run one generation to its end; the tokens it committed."""
    n = 0
    for event in engine.generate(request, controller=controller):
        if not isinstance(event, FinishEvent):
            n += len(event.token_ids)
    return n


def _blocks(policy: EffectivePolicy, labels: Iterable[str], largest: int) -> list[int]:
    """The spec block sizes the policy may choose for these classes (capped at the engine's
    block), largest first."""
    found = {
        b
        for label in labels
        for span in SPAN_KINDS
        for b in policy.rule(label, span).block_sizes
        if b <= largest
    }
    return sorted(found or {largest}, reverse=True)


def lookup_block(engine: Engine) -> int:
    """The engine's lookup block (what the policy's lookup arm runs)."""
    options = getattr(engine, "options", None)
    return int(getattr(options, "lookup", LookupConfig()).block_size)


def plan_runs(
    engine: Engine, policy: EffectivePolicy, plan: CalibrationPlan
) -> tuple[list[tuple[Run, Prepared]], list[int]]:
    """Every run with its prepared request, and the spec block sizes the timing runs measure
    ([] without a drafter)."""
    drafter = engine.draft_id is not None
    largest = int(getattr(engine, "default_block_size", 0) or 16)
    lookup: Arm = ("lookup", lookup_block(engine))
    runs: list[tuple[Run, Prepared]] = []
    for kind, body in class_bodies(plan.prompts_per_kind, plan.thinking_default):
        p = _prepare(engine, body)
        runs.append((Run(kind, AR, plan.max_tokens), p))
        runs.append((Run(kind, lookup, plan.max_tokens), p))
        if drafter:
            # Class runs draft at the largest block the class's policy allows: smaller
            # blocks' tokens per cycle are credited from the same cycles.
            block = _blocks(policy, [p.request_class.label], largest)[0]
            runs.append((Run(kind, ("spec", block), plan.max_tokens), p))
    labels = {p.request_class.label for _, p in runs}
    blocks = _blocks(policy, labels, largest) if drafter else []
    longest = max([plan.max_tokens, *(plan.timing_cycles * b for b in blocks)])
    room = engine.context_length - longest - 64
    timing = [runs[0][1]] + [
        _prepare(engine, long_body(engine, n)) for n in plan.contexts if n < room
    ]
    for p in timing:
        runs.append((Run("timing", AR, plan.timing_steps, True), p))
        runs += [(Run("timing", ("spec", b), plan.timing_cycles * b, True), p) for b in blocks]
    return runs, blocks


def run_calibration(
    engine: Engine,
    policy: EffectivePolicy,
    estimates: Estimates,
    plan: CalibrationPlan = CalibrationPlan(),
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run the plan on `engine`, measuring every step into `estimates`; returns the rows of
    what was measured (`measured_rows`)."""
    from tqdm import tqdm

    runs, blocks = plan_runs(engine, policy, plan)
    _warm_up(engine, runs[0][1].request, blocks, lookup_block(engine))
    bar = tqdm(
        total=len(runs),
        desc="calibrate",
        unit="run",
        file=sys.stderr,
        disable=not progress,
        leave=False,
    )
    try:
        for run, p in runs:
            bar.set_postfix_str(f"{run.kind} {arm_name(run.arm)}", refresh=False)
            controller = ScriptedController(
                estimates,
                policy,
                engine.model_id,
                p.request_class,
                run.arm,
                json_output=p.request_class.kind == "json",
                start_in_reasoning=p.start_in_reasoning,
            )
            request = dataclasses.replace(
                p.request,
                mode=run.arm[0],
                block_size=run.arm[1] if run.arm[0] != "ar" else None,
                draft_length="fixed",
                max_tokens=min(run.max_tokens, p.request.max_tokens),
            )
            _generate(engine, request, controller)
            bar.update()
    finally:
        bar.close()
    classes: dict[str, list[int]] = {}
    for run, p in runs:
        if not run.timing:
            classes.setdefault(p.request_class.label, []).append(len(p.request.prompt_tokens))
    return measured_rows(estimates, engine.model_id, classes, blocks, lookup_block(engine))


def _warm_up(engine: Engine, request: GenerationRequest, blocks: list[int], lookup: int) -> None:
    """One short generation per arm first: first calls compile kernels and grow buffers."""
    for mode, block in [("ar", None), ("lookup", lookup), *(("spec", b) for b in blocks)]:
        warm = dataclasses.replace(
            request, mode=mode, block_size=block, draft_length="fixed", max_tokens=8
        )
        _generate(engine, warm)


# -- what it found ------------------------------------------------------------------------------
def measured_rows(
    est: Estimates,
    model: str,
    classes: Mapping[str, list[int]],
    blocks: list[int],
    lookup: int = 0,
) -> list[dict[str, Any]]:
    """Timing rows (per context bucket: ms per AR step and per spec cycle at each block) and
    class rows (per class and span with measured tokens per cycle: the arms' tok/s at the
    class's median prompt length, lookup's, and the fastest arm there)."""
    rows: list[dict[str, Any]] = []
    buckets = sorted({k[1] for k in est.ar_s if k[0] == model})
    for bucket in buckets:
        ar = est.ar_s.get((model, bucket))
        cycles = {
            str(b): round(1e3 * s.mean, 2)
            for b in blocks
            if (s := est.cycle_s.get((model, b, bucket))) is not None
        }
        rows.append(
            {
                "row": "timing",
                "context": bucket,
                "ar_ms": round(1e3 * ar.mean, 2) if ar is not None else None,
                "ar_steps": ar.count if ar is not None else 0,
                "cycle_ms": cycles,
            }
        )
    for label, lens in sorted(classes.items()):
        ctx = int(statistics.median(lens))
        for span in SPAN_KINDS:
            spec = blocks and est.measured_tau(model, label, span, blocks[0]) is not None
            looked = est.lookup(model, label, span, lookup)[0] if lookup else None
            if not spec and not (looked is not None and looked.samples > 0):
                continue
            row: dict[str, Any] = {"row": "class", "class": label, "span": span, "context": ctx}
            arms = {"ar": est.ar(model, ctx, label, span).tps}
            if spec:
                best = max(
                    (est.surplus(model, label, span, b, ctx) for b in blocks),
                    key=lambda s: s.spec.tps,
                )
                row.update(best.as_dict())
                arms[f"spec{best.block_size}"] = best.spec.tps
            if looked is not None and looked.samples > 0:
                row["lookup_tps"] = round(looked.tps, 2)
                arms[f"lookup{lookup}"] = looked.tps
            row.setdefault("ar_tps", round(arms["ar"], 2))
            row["faster"] = max(arms, key=lambda a: arms[a])
            rows.append(row)
    return rows


def format_rows(rows: Iterable[Mapping[str, Any]]) -> str:
    """The rows as two fixed-width tables."""
    rows = list(rows)
    timing = [r for r in rows if r["row"] == "timing"]
    blocks = sorted({int(b) for r in timing for b in r["cycle_ms"]}, reverse=True)
    lines = [
        f"{'context':>8} {'AR ms/step':>10} " + " ".join(f"{f'spec{b} ms':>10}" for b in blocks)
    ]
    for r in timing:
        cells = " ".join(f"{r['cycle_ms'].get(str(b), float('nan')):>10.2f}" for b in blocks)
        ar = r["ar_ms"] if r["ar_ms"] is not None else float("nan")
        lines.append(f"{r['context']:>8} {ar:>10.2f} {cells}")
    lines += [
        "",
        f"{'class':<40} {'span':<10} {'tau':>5} {'spec tok/s':>10} {'lookup tok/s':>12} "
        f"{'AR tok/s':>9} {'surplus':>8} {'p(spec)':>7} {'n':>4} {'faster':>9}",
    ]
    nan = float("nan")
    for r in rows:
        if r["row"] == "class":
            lines.append(
                f"{r['class']:<40} {r['span']:<10} {r.get('tau', nan):>5.2f} "
                f"{r.get('spec_tps', nan):>10.1f} {r.get('lookup_tps', nan):>12.1f} "
                f"{r.get('ar_tps', nan):>9.1f} {r.get('surplus', nan):>8.1f} "
                f"{r.get('p_spec_faster', nan):>7.2f} {r.get('samples', 0):>4.0f} "
                f"{r['faster']:>9}"
            )
    return "\n".join(lines)


# -- the entry point ----------------------------------------------------------------------------
def state_dir(policy: AdaptivePolicy, model_id: str) -> Path:
    """Where the policy keeps this model's state (and calibration records)."""
    state = policy.model(model_id)
    if state.store is not None:
        return state.store.path.parent
    return state.policy.state_file().parent


def ensure_calibrated(
    engine: Engine,
    policy: AdaptivePolicy,
    plan: CalibrationPlan = CalibrationPlan(),
    *,
    force: bool = False,
    progress: bool = True,
) -> tuple[CalibrationRecord, bool]:
    """The calibration of this engine's pair on this machine: the saved one when it is valid
    and the policy holds estimates for the model, else measured now, seeded into the policy's
    estimates and saved. Returns (record, measured now)."""
    model = engine.model_id
    state = policy.model(model)
    where = state_dir(policy, model)
    key = calibration_key(model, engine.draft_id)
    record = None if force else load_record(where, key)
    if record is not None and model in set(state.estimates.models()):
        log.info("calibration.found", model=model, created=record.created)
        return record, False
    est = state.estimates
    measured = Estimates(
        sample_half_life=state.policy.estimates.sample_half_life,
        half_life_s=est.half_life_s,
        smallest_bucket=est.smallest_bucket,
        clock=est.clock,
        timing_scope=est.timing_scope,
    )
    log.info("calibration.start", model=model, draft=engine.draft_id)
    t0 = time.perf_counter()
    rows = run_calibration(engine, state.policy, measured, plan, progress)
    wall = time.perf_counter() - t0
    entries = seed(est, measured, plan.timing_weight, plan.tau_weight)
    state.dirty = True
    policy.save(force=True)
    record = CalibrationRecord(key, time.time(), round(wall, 2), tuple(rows))
    path = save_record(where, record)
    log.info(
        "calibration.done",
        model=model,
        wall_s=round(wall, 1),
        entries=entries,
        record=str(path) if path else None,
    )
    return record, True
