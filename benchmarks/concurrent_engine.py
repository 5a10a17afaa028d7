"""The batch scheduler's decode rule at the engine, no HTTP: the same pool of requests run one
after another through `generate` ("serial") and through `EngineBatcher` with up to k rows,
their spec-mode rows advancing by batched verify ("spec k"), by batched AR ("ar k") or as the
band rule chooses ("learnt k", the default; a fresh batcher per run, so every run includes
its exploration).

    python benchmarks/concurrent_engine.py --repeats 3 --json benchmarks/results/concurrent_engine.json

Each configuration runs the whole pool (the embedded benchmark prompts, kinds interleaved,
greedy, `--max-tokens`, natural end of turn) and is timed end to end; configurations are
interleaved per repeat and compared to serial by the median. Outputs are compared to serial's.
Every configuration runs the pool once untimed first (serial's is the reference): a batch of k
rows meets shapes one request never does, and a GPU builds its kernels for them on first use.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.api import GenerationRequest, TokenEvent
from toolflash.engine.batching.batcher import EngineBatcher, queue_ahead_on
from toolflash.engine.factory import build_engine

PROMPTS = Path(__file__).resolve().parent.parent / "toolflash/assets/tiny/bench_prompts.jsonl"


def requests(
    engine: Any, n: int, max_tokens: int, ignore_eos: bool = False
) -> list[GenerationRequest]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    kinds = sorted({r["kind"] for r in rows})
    by_kind = {k: [r for r in rows if r["kind"] == k] for k in kinds}
    picked = [by_kind[kinds[i % len(kinds)]][i // len(kinds)] for i in range(n)]
    return [
        GenerationRequest(
            tuple(engine.encode_chat(r["messages"], r.get("tools"), r.get("chat_template_kwargs"))),
            max_tokens,
            mode="spec",
            ignore_eos=ignore_eos,
        )
        for r in picked
    ]


def serial(engine: Any, reqs: list[GenerationRequest]) -> list[list[int]]:
    return [
        [t for e in engine.generate(r) if isinstance(e, TokenEvent) for t in e.token_ids]
        for r in reqs
    ]


def batched(
    engine: Any,
    reqs: list[GenerationRequest],
    rows: int,
    spec_rows: int | None,
    prefill_thread: bool | None = None,
    queue_ahead: bool | None = None,
) -> list[list[int]]:
    batcher = EngineBatcher(
        engine, rows, spec_rows=spec_rows, prefill_thread=prefill_thread, queue_ahead=queue_ahead
    )
    pending = list(enumerate(reqs))
    out: dict[Any, list[int]] = {}
    while pending or batcher.size:
        while pending and batcher.size < rows:
            batcher.add(*pending.pop(0))
        for key, events in batcher.step():
            assert not isinstance(events, BaseException), events
            out.setdefault(key, []).extend(
                t for e in events if isinstance(e, TokenEvent) for t in e.token_ids
            )
    return [out[i] for i in range(len(reqs))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="toolflash-tiny-qwen35")
    p.add_argument("--rows", default="2,4,8")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--modes",
        default="ar,spec,learnt",
        help="batched step kinds to run (comma list): ar (batched AR always), spec (batched "
        "verify for every row count), learnt (the default: the band rule chooses)",
    )
    p.add_argument(
        "--ignore-eos", action="store_true", help="every request runs --max-tokens (random weights)"
    )
    p.add_argument(
        "--prefill-thread",
        choices=("default", "both"),
        default="default",
        help="both: every batched configuration also runs without the prefill thread",
    )
    p.add_argument(
        "--queue-ahead",
        choices=("default", "both"),
        default="default",
        help="both: every batched configuration also runs with the other queue-ahead setting",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    engine = build_engine(args.model)
    reqs = requests(engine, args.prompts, args.max_tokens, args.ignore_eos)
    reference = serial(engine, reqs)  # also the warm-up
    tokens = sum(len(t) for t in reference)
    configs: dict[str, Any] = {"serial": lambda: serial(engine, reqs)}
    for k in (int(r) for r in args.rows.split(",")):
        for mode in args.modes.split(","):
            spec_rows = {"ar": 0, "spec": k, "learnt": None}[mode]
            configs[f"{mode} {k}"] = lambda k=k, s=spec_rows: batched(engine, reqs, k, s)
            if args.queue_ahead == "both":
                flip = not queue_ahead_on(mx.default_device().type.name)
                configs[f"{mode} {k} queue ahead {'on' if flip else 'off'}"] = (
                    lambda k=k, s=spec_rows, q=flip: batched(engine, reqs, k, s, queue_ahead=q)
                )
            if args.prefill_thread == "both":
                configs[f"{mode} {k} no prefill thread"] = lambda k=k, s=spec_rows: batched(
                    engine, reqs, k, s, prefill_thread=False
                )
    walls: dict[str, list[float]] = {name: [] for name in configs}
    differ: dict[str, int] = dict.fromkeys(configs, 0)
    for name in list(configs)[1:]:  # the warm-up (serial's was the reference run)
        differ[name] = sum(a != b for a, b in zip(configs[name](), reference))
    for rep in range(args.repeats):
        names = list(configs) if rep % 2 == 0 else list(reversed(configs))
        for name in names:
            t0 = time.perf_counter()
            out = configs[name]()
            walls[name].append(time.perf_counter() - t0)
            differ[name] = max(differ[name], sum(a != b for a, b in zip(out, reference)))
            print(f"rep {rep} {name}: {walls[name][-1]:.2f} s", flush=True)
    base = statistics.median(walls["serial"])
    rows = [
        {
            "config": name,
            "wall_s": [round(w, 3) for w in walls[name]],
            "tok_s": round(tokens / statistics.median(walls[name]), 1),
            "ratio_to_serial": round(base / statistics.median(walls[name]), 2),
            "outputs_differing_from_serial": differ[name],
        }
        for name in configs
    ]
    report = {
        "command": "python benchmarks/concurrent_engine.py " + " ".join(argv or sys.argv[1:]),
        "model": args.model,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "ignore_eos": args.ignore_eos,
        "device": str(mx.default_device()),
        "completion_tokens": tokens,
        "results": rows,
        "machine": platform.platform(),
    }
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
