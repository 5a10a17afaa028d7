"""Time to first token on long agent prompts (1k-32k tokens; a prompt must stay below the
model's context, 32768 for the embedded pairs): mlx-lm against toolflash's dense
prefill and its opt-in sparse prefill at several keep ratios, cold and with a prefix-cache hit
of the system prompt.

    flock /tmp/bench.lock nice -n -15 env OPENBLAS_NUM_THREADS=1 \\
        LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \\
        python benchmarks/ttft_long_prompts.py --model toolflash-tiny-qwen35 \\
        --lengths 1024,4096,8192,16384,32000 --keeps 0.5,0.25,0.125 --repeats 3

Variants, run on the same token ids and the same weights (the engine's target model is the one
mlx-lm runs), interleaved round by round so their ratios share the machine's state:
- `mlx-lm`: `mlx_lm.generate.generate_step` (what `mlx_lm.server` runs; its own chunked
  prefill, 2048 tokens a step), time to its first token;
- `dense`: toolflash's engine (`generate`, one output token), time to its first token event;
- `sparse-K`: the same with `sparse_prefill` keeping about K of the prompt (`--scorer`);
- each again `warm`: the system prompt (system message + tool list) already computed, in
  mlx-lm's prompt cache or toolflash's prefix cache (restored, not timed);
- with `--caches ...,publish`, toolflash's variants again cold as its server runs a cache miss:
  the prefill stops at the system prompt's end to publish that state (`publish_at`), which
  splits its forwards where a `warm` run starts (compared with mlx-lm cold).
Prefill tok/s counts the tokens each run computed (a warm run skips the system prompt; a sparse
one the dropped chunks). Prompts: the zoo's agent dialogues with earlier dialogues' turns as
distractor context (`benchmarks/sparse_prompts.py`), cut to the exact length by dropping
history tokens right after the system prompt; the last turn and the generation header stay.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from script_env import ensure_optimized_blas_for_script
from sparse_prompts import _material, build_prompt  # noqa: E402

from toolflash.bench import machine_info  # noqa: E402
from toolflash.cache.prefix_cache import CacheConfig, PrefixCache  # noqa: E402
from toolflash.cache.state import SessionState  # noqa: E402
from toolflash.engine.api import FinishEvent, GenerationRequest  # noqa: E402
from toolflash.engine.sparse import SparsePrefill  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CACHES = ("cold", "publish", "warm")


def long_prompt(
    engine: Any, length: int, rng: random.Random, code: list[str]
) -> tuple[list[int], int]:
    """Token ids of exactly `length` tokens and the system prompt's length in them."""

    def count(msgs: list[dict[str, Any]], tools: list[dict[str, Any]], kw: dict[str, Any]) -> int:
        return len(engine.encode_chat(msgs, tools, kw))

    row = build_prompt(rng, code, length + 64, count, max_tools=6)
    msgs, tools, kw = row["messages"], row["tools"], row["chat_template_kwargs"]
    ids = engine.encode_chat(msgs, tools, kw)
    system = engine.stable_prefix(msgs[:1], tools, kw, ids)
    cut = len(ids) - length
    if system + cut > len(ids) - 64:
        raise SystemExit(f"the system prompt ({system} tokens) does not fit {length} tokens")
    return ids[:system] + ids[system + cut :], system


def mlx_lm_ttft(model: Any, ids: Sequence[int], system: int) -> tuple[float, float, int]:
    """mlx-lm's time to first token, the process CPU time it took, and the token; `system` > 0: that prefix is in its prompt
    cache already (filled before the clock starts)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    if system:
        for pos in range(0, system, 2048):
            model(mx.array([list(ids[pos : min(pos + 2048, system)])]), cache=cache)
            mx.eval([c.state for c in cache])
    c0, t0 = time.process_time(), time.perf_counter()
    for token, _ in generate_step(
        mx.array(list(ids[system:])), model, max_tokens=1, prompt_cache=cache
    ):
        return time.perf_counter() - t0, time.process_time() - c0, int(token)
    raise RuntimeError("mlx-lm produced no token")


def toolflash_ttft(
    engine: Any,
    ids: Sequence[int],
    seed: SessionState | None,
    sparse: SparsePrefill | None,
    publish_at: tuple[int, ...] = (),
) -> tuple[float, float, int, int, bool]:
    """The engine's time to first token, its process CPU time, the token, prompt tokens
    computed, whether sparse.
    `seed`: the system prompt's state in a fresh prefix cache; `publish_at`: positions whose
    states the request publishes into a fresh, empty one (neither: no cache)."""
    engine.prefix_cache = None
    if seed is not None or publish_at:
        engine.prefix_cache = PrefixCache(CacheConfig())
    if seed is not None:
        engine.prefix_cache.publish(engine.cache_key, seed)
    request = GenerationRequest(
        tuple(ids), 1, mode="ar", sparse_prefill=sparse, publish_at=publish_at
    )
    c0, t0 = time.process_time(), time.perf_counter()
    ttft = cpu = 0.0
    first = -1
    for event in engine.generate(request):
        if isinstance(event, FinishEvent):
            engine.prefix_cache = None
            return ttft, cpu, first, event.stats.computed_tokens, event.stats.sparse
        if first < 0:
            ttft, cpu = time.perf_counter() - t0, time.process_time() - c0
            first = event.token_ids[0]
    raise RuntimeError("no finish event")


def system_state(engine: Any, ids: Sequence[int], system: int) -> SessionState:
    """The dense state after the system prompt, as the prefix cache would hold it."""
    engine.prefix_cache = PrefixCache(CacheConfig())
    for _ in engine.generate(GenerationRequest(tuple(ids[:system]), 1, mode="ar")):
        pass
    hit = engine.prefix_cache.lookup(engine.cache_key, ids[:system])
    engine.prefix_cache = None
    assert hit is not None and len(hit.snapshot.tokens) == system
    return hit.snapshot.state


def run(args: argparse.Namespace) -> dict[str, Any]:
    from toolflash.engine.factory import build_engine

    engine = build_engine(args.model, cache=CacheConfig(enabled=False))
    if args.prefill_chunk:
        engine.options = dataclasses.replace(engine.options, prefill_chunk=args.prefill_chunk)
    keeps = [float(k) for k in args.keeps.split(",")] if args.keeps else []
    caches = [c.strip() for c in args.caches.split(",") if c.strip()]
    if not caches or any(c not in CACHES for c in caches):
        raise SystemExit(f"--caches: a comma list of {', '.join(CACHES)}")
    lengths = [int(x) for x in args.lengths.split(",")]
    variants = ["mlx-lm", "dense", *(f"sparse-{k:g}" for k in keeps)]
    rng = random.Random(args.seed)
    code, _ = _material(rng)
    prompts = {n: long_prompt(engine, n, rng, code) for n in lengths}
    seeds = {n: system_state(engine, ids, sys_n) for n, (ids, sys_n) in prompts.items()}
    runs: dict[str, list[dict[str, Any]]] = {}
    # Warm-up: every code path once on a short prompt (compilation, allocations).
    ids0, sys0 = prompts[lengths[0]]
    mlx_lm_ttft(engine.target.model, ids0, 0)
    for k in keeps:
        toolflash_ttft(engine, ids0, None, SparsePrefill(k, 0, args.chunk, args.scorer))
    toolflash_ttft(engine, ids0, seeds[lengths[0]], None)
    if "publish" in caches:
        toolflash_ttft(engine, ids0, None, None, (sys0,))
    for rep in range(args.repeats):
        for n in lengths:
            ids, sys_n = prompts[n]
            for cache in caches:
                warm = cache == "warm"
                for variant in variants:
                    key = f"{n}/{variant}/{cache}"
                    if variant == "mlx-lm":
                        if cache == "publish":  # toolflash's alone: compared with mlx-lm cold
                            continue
                        ttft, cpu, tok = mlx_lm_ttft(engine.target.model, ids, sys_n if warm else 0)
                        computed, sparse = n - (sys_n if warm else 0), False
                    else:
                        sp = None
                        if variant.startswith("sparse-"):
                            sp = SparsePrefill(float(variant[7:]), 0, args.chunk, args.scorer)
                        ttft, cpu, tok, computed, sparse = toolflash_ttft(
                            engine,
                            ids,
                            seeds[n] if warm else None,
                            sp,
                            (sys_n,) if cache == "publish" else (),
                        )
                    runs.setdefault(key, []).append(
                        {"rep": rep, "ttft_s": ttft, "cpu_s": cpu, "token": tok,
                         "computed": computed, "sparse": sparse}
                    )  # fmt: skip
                    print(f"rep {rep} {key:28s} {ttft:8.3f}s  cpu {cpu:8.3f}s  computed {computed}",
                          flush=True)  # fmt: skip
                    mx.clear_cache()
        if args.partial:  # what the finished rounds measured, in case a later one fails
            rep_so_far = report(args, engine, lengths, variants, prompts, runs)
            Path(args.partial).write_text(json.dumps(rep_so_far, indent=1) + "\n")
    return report(args, engine, lengths, variants, prompts, runs)


def report(
    args: argparse.Namespace,
    engine: Any,
    lengths: list[int],
    variants: list[str],
    prompts: dict[int, tuple[list[int], int]],
    runs: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    rows = []
    for n in lengths:
        for cache in CACHES:
            base_cache = "cold" if cache == "publish" else cache
            if f"{n}/mlx-lm/{base_cache}" not in runs or f"{n}/dense/{cache}" not in runs:
                continue
            base = runs[f"{n}/mlx-lm/{base_cache}"]
            base_med = statistics.median(r["ttft_s"] for r in base)
            for variant in variants:
                if f"{n}/{variant}/{cache}" not in runs:  # mlx-lm has no `publish` runs
                    continue
                rs = runs[f"{n}/{variant}/{cache}"][: len(base)]
                med = statistics.median(r["ttft_s"] for r in rs)
                # Per repetition: the ratio to mlx-lm's run of the same round.
                per_rep = [b["ttft_s"] / r["ttft_s"] for b, r in zip(base, rs)]
                rows.append(
                    {
                        "prompt_tokens": n,
                        "system_tokens": prompts[n][1],
                        "cache": cache,
                        "variant": variant,
                        "ttft_s": [r["ttft_s"] for r in rs],
                        "ttft_median_s": med,
                        "computed_tokens": rs[0]["computed"],
                        "sparse": rs[0]["sparse"],
                        "prefill_tok_s": rs[0]["computed"] / med,
                        "speedup_vs_mlx_lm": base_med / med,
                        "speedup_per_rep": per_rep,
                        # Process CPU time (all threads): what the prefill cost this process,
                        # less disturbed than wall time by other work on a shared CPU.
                        "cpu_median_s": statistics.median(r["cpu_s"] for r in rs),
                        "cpu_speedup_vs_mlx_lm": statistics.median(r["cpu_s"] for r in base)
                        / statistics.median(r["cpu_s"] for r in rs),
                        "first_token_as_mlx_lm": sum(
                            r["token"] == b["token"] for b, r in zip(base, rs)
                        ),
                    }
                )
    return {
        "benchmark": "ttft_long_prompts",
        "command": " ".join(["python", "benchmarks/ttft_long_prompts.py", *sys.argv[1:]]),
        "model": engine.model_id,
        "scorer": args.scorer,
        "chunk": args.chunk,
        "repeats": args.repeats,
        "machine": machine_info(),
        "rows": rows,
    }


def format_table(rep: dict[str, Any]) -> str:
    out = [f"{rep['model']}  (TTFT median of {rep['repeats']}, speedup = mlx-lm / variant)"]
    out.append(
        f"{'tokens':>7} {'cache':7} {'variant':13} {'TTFT s':>8} {'computed':>9} "
        f"{'tok/s':>8} {'vs mlx-lm':>9} {'CPU s':>8} {'CPU vs':>7}"
    )
    for r in rep["rows"]:
        out.append(
            f"{r['prompt_tokens']:>7} {r['cache']:7} {r['variant']:13} {r['ttft_median_s']:8.3f} "
            f"{r['computed_tokens']:>9} {r['prefill_tok_s']:8.0f} {r['speedup_vs_mlx_lm']:8.2f}x"
            f" {r.get('cpu_median_s', 0):8.3f} {r.get('cpu_speedup_vs_mlx_lm', 0):6.2f}x"
        )
    return "\n".join(out)


def plot(rep: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for cache, style in (("cold", "-"), ("publish", ":"), ("warm", "--")):
        rows = [r for r in rep["rows"] if r["cache"] == cache]
        for variant in dict.fromkeys(r["variant"] for r in rows):
            vr = [r for r in rows if r["variant"] == variant]
            xs = [r["prompt_tokens"] for r in vr]
            axes[0].plot(xs, [r["ttft_median_s"] for r in vr], style, marker="o",
                         label=f"{variant} ({cache})")  # fmt: skip
            axes[1].plot(xs, [r["speedup_vs_mlx_lm"] for r in vr], style, marker="o",
                         label=f"{variant} ({cache})")  # fmt: skip
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt tokens")
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("time to first token (s)")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("TTFT speedup vs mlx-lm (same cache state)")
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"TTFT on long agent prompts: {rep['model']} (scorer {rep['scorer']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="embedded pair id or path (default qwen35)")
    ap.add_argument("--lengths", default="1024,4096,8192,16384")
    ap.add_argument("--keeps", default="0.5,0.25,0.125")
    ap.add_argument(
        "--caches",
        default="cold,warm",
        help=f"cache states to run, of {', '.join(CACHES)} (publish: toolflash's cold run as "
        "its server's, publishing the system prompt's state)",
    )
    ap.add_argument("--scorer", default="structural")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--prefill-chunk", type=int, default=0, help="the engine's (default: its own)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="default results/ttft_long_prompts_<model>.json")
    ap.add_argument("--partial", default=None, help="rewrite this JSON after every round")
    ap.add_argument("--replot", default=None, help="only redraw the PNG of this JSON report")
    args = ap.parse_args(argv)
    if args.replot:
        plot(json.loads(Path(args.replot).read_text()), Path(args.replot).with_suffix(".png"))
        return 0
    rep = run(args)
    print(format_table(rep))
    name = str(rep["model"]).rsplit("/", 1)[-1].removeprefix("toolflash-tiny-")
    path = Path(args.json) if args.json else RESULTS / f"ttft_long_prompts_{name}.json"
    path.write_text(json.dumps(rep, indent=1) + "\n")
    plot(rep, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
