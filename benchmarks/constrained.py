"""Grammar-constrained decoding on the shipped tiny pair: tok/s of constrained AR (one token per
step, and with jump-forward: a grammar-forced run fed in one forward, for runs of 1+ and 2+
tokens), constrained speculative decoding (with the forced-stretch fast path on and off) and
unconstrained decoding on the same prompts; the share of drafted tokens the grammar rejected;
the mask cost per token.

    OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \\
        python benchmarks/constrained.py [--reps 3] [--blocks 16,8] [--out benchmarks/results]

Each request runs every variant back to back (interleaved per repetition, so drift spreads
evenly). Decoding drives a `GenerationSession` directly, as the engine does, so the grammar
processor's counters can be read. Greedy decoding makes every constrained variant's output
identical to constrained one-token AR; the script checks it. Writes `constrained.json` to --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from script_env import ensure_optimized_blas_for_script

from toolflash.engine.api import GenerationRequest, Mode, OutputConstraint, ToolSpec
from toolflash.engine.choosers import GreedyChooser
from toolflash.engine.constraints import constraint_processors
from toolflash.engine.constraints.processor import GrammarProcessor
from toolflash.engine.factory import build_engine
from toolflash.engine.service import DFlashEngine
from toolflash.engine.session import GenerationSession
from toolflash.engine.stops import StopMatcher

USER = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PLAN = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "action": {"enum": ["read", "edit", "run", "search"]},
                    "path": {"type": "string"},
                },
                "required": ["action", "path"],
                "additionalProperties": False,
            },
        },
        "done": {"type": "boolean"},
    },
    "required": ["steps", "done"],
    "additionalProperties": False,
}
REVIEW = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["approve", "request_changes", "comment"]},
        "summary": {"type": "string", "maxLength": 120},
        "issues": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "file": {"type": "string"},
                    "line": {"type": "integer"},
                    "severity": {"enum": ["low", "medium", "high"]},
                },
                "required": ["file", "severity"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["verdict", "summary"],
    "additionalProperties": False,
}
WEATHER = ToolSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    strict=True,
)
SEARCH = ToolSpec(
    "search_code",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}},
        "required": ["query"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "json" or "tool-forced"
    user: str
    constraint: OutputConstraint
    tools: tuple[ToolSpec, ...] = ()
    template: Mapping[str, Any] = field(default_factory=lambda: {"enable_thinking": False})


def _json(schema: dict[str, Any]) -> OutputConstraint:
    return OutputConstraint("json", schema=schema)


def _forced(tools: tuple[ToolSpec, ...], fmt: str) -> OutputConstraint:
    return OutputConstraint("tool_calls", tools=tools, tool_format=fmt, parallel_calls=False)


CASES = (
    Case("user", "json", "Give me a JSON object describing a user.", _json(USER)),
    Case("plan", "json", "Return the plan as JSON: files to read and edit.", _json(PLAN)),
    Case("review", "json", "Review this diff and answer as JSON.", _json(REVIEW)),
    Case("any_object", "json", "Describe the project config as JSON.", OutputConstraint("json")),
    Case(
        "tool_required_hermes",
        "tool-forced",
        "Find where the retry logic is implemented.",
        _forced((WEATHER, SEARCH), "hermes"),
        (WEATHER, SEARCH),
    ),
    Case(
        "tool_named_hermes",
        "tool-forced",
        "What's the weather in Oslo?",
        _forced((WEATHER,), "hermes"),
        (WEATHER, SEARCH),
    ),
    Case(
        "tool_required_xml",
        "tool-forced",
        "Search the code for the config loader.",
        _forced((WEATHER, SEARCH), "qwen3_coder"),
        (WEATHER, SEARCH),
        {"enable_thinking": False, "tool_call_format": "qwen3_coder"},
    ),
)


@dataclass
class Run:
    tokens: list[int]
    decode_s: float
    drafted: int = 0
    accepted: int = 0
    cycles: int = 0
    proc: GrammarProcessor | None = None


def decode(
    engine: DFlashEngine,
    request: GenerationRequest,
    mode: Mode,
    block: int,
    fast_forward: bool = True,
    guided: bool = True,
    min_forced: int = 1,
) -> Run:
    """One generation through a session, as `DFlashEngine.generate` runs it (no policy).
    `fast_forward` False also turns AR jump-forward off (the grammar offers no forced runs)."""
    procs = list(
        constraint_processors(
            request, engine.tokenizer, fast_forward=fast_forward, min_forced=min_forced
        )
    )
    chooser = GreedyChooser(procs, guided=guided)
    session = GenerationSession(
        engine.target, engine.drafter, window=engine.options.window, chooser=chooser
    )
    stops = StopMatcher(engine.eos_ids, (), request.max_tokens, engine.decode)
    out = [session.prefill(list(request.prompt_tokens))]
    finished = stops.check(out) is not None
    run = Run(out, 0.0)
    t0 = time.perf_counter()
    while not finished:
        step = session.step(mode, min(block, stops.remaining), stops.check)
        out += step.tokens
        run.drafted += step.record.drafted
        run.accepted += step.record.accepted
        run.cycles += 1
        finished = step.finished
    run.decode_s = time.perf_counter() - t0
    proc = procs[0] if procs else None
    run.proc = proc if isinstance(proc, GrammarProcessor) else None
    return run


Variant = tuple[str, bool, Mode, int, bool, bool, int]


def variants(blocks: Sequence[int]) -> list[Variant]:
    """(name, constrained, mode, block, fast_forward, grammar-guided draft, min forced run).
    `constrained_ar` is one token per step (as before jump-forward); `constrained_ar_jump`
    feeds every forced run in one forward, `_min2` only runs of two or more tokens."""
    out: list[Variant] = [
        ("free_ar", False, "ar", 1, False, False, 1),
        ("constrained_ar", True, "ar", 1, False, False, 1),
        ("constrained_ar_jump", True, "ar", 1, True, False, 1),
        ("constrained_ar_jump_min2", True, "ar", 1, True, False, 2),
    ]
    for b in blocks:
        out += [
            (f"free_spec_b{b}", False, "spec", b, False, False, 1),
            (f"constrained_spec_b{b}", True, "spec", b, True, True, 1),
            (f"constrained_spec_b{b}_unguided", True, "spec", b, True, False, 1),
            (f"constrained_spec_b{b}_no_ff", True, "spec", b, False, True, 1),
        ]
    return out


def run_case(
    engine: DFlashEngine, case: Case, blocks: Sequence[int], reps: int, max_tokens: int
) -> dict[str, Any]:
    tools = [
        {"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
        for t in case.tools
    ]
    prompt = tuple(
        engine.encode_chat([{"role": "user", "content": case.user}], tools or None, case.template)
    )
    acc: dict[str, dict[str, Any]] = {}
    outputs: dict[str, list[int]] = {}
    for rep in range(reps):
        order = variants(blocks)
        if rep % 2:
            order.reverse()
        for name, constrained, mode, block, ff, guided, min_forced in order:
            req = GenerationRequest(
                prompt, max_tokens, constraint=case.constraint if constrained else None
            )
            r = decode(engine, req, mode, block, ff, guided, min_forced)
            a = acc.setdefault(name, {"tokens": 0, "decode_s": [], "drafted": 0, "accepted": 0})
            a["tokens"] = len(r.tokens) - 1  # the prefill's token is not decode work
            a["decode_s"].append(r.decode_s)
            a["drafted"], a["accepted"], a["cycles"] = r.drafted, r.accepted, r.cycles
            if r.proc is not None:
                s = r.proc.stats()
                a["grammar"] = {
                    "masks": s.mask_rows,
                    "mask_s": s.mask_s,
                    "drafted_checked": s.drafted,
                    "grammar_rejected": s.grammar_rejected,
                    "grammar_cuts": s.grammar_cuts,
                    "forced_runs": s.forced_runs,
                    "forced_tokens": s.forced_tokens,
                }
            outputs[name] = r.tokens
    ar = outputs["constrained_ar"]
    identical = all(outputs[n] == ar for n in outputs if n.startswith("constrained_spec"))
    jump_identical = all(outputs[n] == ar for n in outputs if n.startswith("constrained_ar_jump"))
    for a in acc.values():
        a["decode_s"] = statistics.median(a["decode_s"])
        a["tok_s"] = a["tokens"] / a["decode_s"] if a["decode_s"] > 0 else 0.0
    return {
        "case": case.name,
        "kind": case.kind,
        "prompt_tokens": len(prompt),
        "constrained_output": engine.decode(ar),
        "constrained_spec_equals_ar": identical,
        "constrained_ar_jump_equals_ar": jump_identical,
        "variants": acc,
    }


def summarize(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per variant over all cases: total tokens / total (median) decode time, grammar totals."""
    out: dict[str, Any] = {}
    for name in names:
        vs = [r["variants"][name] for r in rows]
        tokens = sum(v["tokens"] for v in vs)
        secs = sum(v["decode_s"] for v in vs)
        entry: dict[str, Any] = {"tokens": tokens, "tok_s": tokens / secs if secs else 0.0}
        # Tokens per cycle (spec) or per step (AR: above 1 when jump-forward took runs).
        entry["tokens_per_cycle"] = tokens / max(1, sum(v["cycles"] for v in vs))
        gs = [v["grammar"] for v in vs if "grammar" in v]
        if gs:
            checked = sum(g["drafted_checked"] for g in gs)
            masks = sum(g["masks"] for g in gs)
            mask_s = sum(g["mask_s"] for g in gs)
            entry["grammar"] = {
                "drafted_checked": checked,
                "grammar_rejected": sum(g["grammar_rejected"] for g in gs),
                "grammar_cuts": sum(g["grammar_cuts"] for g in gs),
                "cycles": sum(v["cycles"] for v in vs),
                "rejected_share": sum(g["grammar_rejected"] for g in gs) / checked
                if checked
                else 0.0,
                "forced_tokens": sum(g["forced_tokens"] for g in gs),
                "forced_share_of_output": sum(g["forced_tokens"] for g in gs) / tokens
                if tokens
                else 0.0,
                "mask_rows": masks,
                "mask_us_per_row": 1e6 * mask_s / masks if masks else 0.0,
                "mask_us_per_token": 1e6 * mask_s / tokens if tokens else 0.0,
                "mask_share_of_decode": mask_s / secs if secs else 0.0,
            }
        out[name] = entry
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--draft")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--blocks", default="16,8")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    import mlx.core as mx

    blocks = [int(b) for b in args.blocks.split(",")]
    engine = build_engine(args.model, args.draft)
    decode(engine, GenerationRequest(tuple(engine.encode("warm up")), 8), "spec", blocks[0])
    t0 = time.perf_counter()
    rows = [run_case(engine, c, blocks, args.reps, args.max_tokens) for c in CASES]
    names = [v[0] for v in variants(blocks)]
    by_kind = {
        kind: summarize([r for r in rows if r["kind"] == kind], names)
        for kind in sorted({r["kind"] for r in rows})
    }
    import llguidance

    report = {
        "benchmark": "constrained",
        "model": engine.model_id,
        "draft": engine.draft_id,
        "blocks": blocks,
        "reps": args.reps,
        "max_tokens": args.max_tokens,
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "mlx": getattr(mx, "__version__", "?"),
            "llguidance": llguidance.__version__,
            "device": str(mx.default_device()),
        },
        "wall_s": time.perf_counter() - t0,
        "constrained_spec_equals_ar": all(r["constrained_spec_equals_ar"] for r in rows),
        "constrained_ar_jump_equals_ar": all(r["constrained_ar_jump_equals_ar"] for r in rows),
        "overall": summarize(rows, names),
        "by_kind": by_kind,
        "cases": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "constrained.json").write_text(json.dumps(report, indent=2) + "\n")
    print(format_report(report))
    same = report["constrained_spec_equals_ar"] and report["constrained_ar_jump_equals_ar"]
    return 0 if same else 1


def format_report(rep: Mapping[str, Any]) -> str:
    """tok/s; tau (tokens per cycle, or per AR step); rej%: drafted tokens the grammar removed (the first
    forbidden one and all after it); cut%: cycles whose draft the grammar cut; ff%: output
    tokens that were grammar-forced (verified without the drafter); us/row: mask cost per
    mask row; us/tok: mask cost per output token; mask%: mask time share of decode."""
    lines = [
        f"model {rep['model']}  draft {rep['draft']}  reps {rep['reps']}  "
        f"constrained spec == constrained AR: {rep['constrained_spec_equals_ar']}  "
        f"AR jump-forward == AR: {rep['constrained_ar_jump_equals_ar']}"
    ]
    for scope, table in [("overall", rep["overall"]), *rep["by_kind"].items()]:
        lines.append(
            f"\n[{scope}] {'variant':<28}{'tok/s':>8}{'tau':>6}{'rej%':>7}{'cut%':>6}"
            f"{'ff%':>6}{'us/row':>8}{'us/tok':>8}{'mask%':>7}"
        )
        for name, e in table.items():
            g = e.get("grammar", {})
            lines.append(
                f"{'':>{len(scope) + 3}}{name:<28}{e['tok_s']:>8.1f}"
                f"{e.get('tokens_per_cycle', 0):>6.2f}"
                f"{100 * g.get('rejected_share', 0):>7.1f}"
                f"{100 * g.get('grammar_cuts', 0) / max(1, g.get('cycles', 1)):>6.1f}"
                f"{100 * g.get('forced_share_of_output', 0):>6.1f}"
                f"{g.get('mask_us_per_row', 0):>8.0f}{g.get('mask_us_per_token', 0):>8.0f}"
                f"{100 * g.get('mask_share_of_decode', 0):>7.1f}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
