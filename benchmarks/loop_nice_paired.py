"""The event loop's priority (`loop_nice`) measured in pairs: one server process with the
embedded pair, greedy AR streams of 128 tokens, each pair of requests one at the process's nice
and one with the loop thread N steps lower, order alternating; the engine alone runs the same
prompt beside each pair. Pairs in one process move together with the machine's load, so their
differences resolve what separate runs of `gateway_overhead.py` cannot.

    flock /tmp/bench.lock nice -n -15 python benchmarks/loop_nice_paired.py --pairs 30 --nice 10
    (add --ignore-eos bias for the logit-bias path; needs root or CAP_SYS_NICE: the loop's
    priority is raised back between requests)

Figures: the engine's decode time of each request (the server's `toolflash.timings.decode_s`),
and how long after the engine handed a token over the loop took it (`Job.push` -> `Job._take`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import gateway_overhead as g
import sse_socket_client
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.api import Engine, FinishEvent, GenerationRequest, SamplingParams
from toolflash.engine.factory import build_engine
from toolflash.gateway import worker as worker_module
from toolflash.gateway.app import create_app
from toolflash.gateway.config import GatewayConfig

LAGS: dict[str, list[float]] = {"base": [], "lowered": []}
_now = ["base"]
_push, _take = worker_module.Job.push, worker_module.Job._take


def _stamped_push(self: Any, kind: str, payload: Any) -> None:
    self.__dict__.setdefault("_pushed_at", []).append(time.perf_counter())
    _push(self, kind, payload)


async def _timed_take(self: Any, not_before: float = 0.0) -> Any:
    items = await _take(self, not_before)
    now, stamps = time.perf_counter(), self.__dict__.setdefault("_pushed_at", [])
    taken = min(len(items), len(stamps))
    LAGS[_now[0]].extend(now - t for t in stamps[:taken])
    del stamps[:taken]
    return items


def direct_decode(engine: Engine, prompt: str, banned: tuple[int, ...], flag: bool) -> float:
    tokens = engine.encode_chat(g.messages(prompt), None, {"enable_thinking": False})
    request = GenerationRequest(
        prompt_tokens=tuple(tokens),
        max_tokens=128,
        mode="ar",
        ignore_eos=flag,
        sampling=SamplingParams(logit_bias=dict.fromkeys(banned, -100.0)),
    )
    for ev in engine.generate(request):
        if isinstance(ev, FinishEvent):
            return ev.stats.decode_s
    raise RuntimeError("no FinishEvent")


def streamed_decode(url: str, prompt: str, banned: tuple[int, ...], flag: bool) -> float:
    body = g.request_body(prompt, 128, True, banned, flag)
    _, _, last = sse_socket_client.post(f"{url}/v1/chat/completions", body, True)
    return float(last["toolflash"]["timings"]["decode_s"])


def spread(xs: list[float], scale: float) -> dict[str, float]:
    q1, med, q3 = statistics.quantiles(xs, n=4)
    return {
        "median": round(med * scale, 3),
        "p25": round(q1 * scale, 3),
        "p75": round(q3 * scale, 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--nice", type=int, default=10, help="steps the loop thread is lowered")
    p.add_argument("--ignore-eos", choices=("flag", "bias"), default="flag")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    worker_module.Job.push, worker_module.Job._take = _stamped_push, _timed_take  # type: ignore[method-assign]
    config = GatewayConfig(mode="ar", max_queue=64)
    app = create_app(lambda: build_engine(None, None, mode="ar"), config)
    url, server, thread = g.start_server(app)
    g.wait_ready(url, 1800)
    worker = app.state.gateway.worker
    tid = thread.native_id or 0
    base = os.getpriority(os.PRIO_PROCESS, tid)
    flag = args.ignore_eos == "flag"
    banned: tuple[int, ...] = ()
    if not flag:
        banned = worker.call(lambda e: tuple(sorted(e.eos_ids))).result()
    decode: dict[str, list[float]] = {"direct": [], "base": [], "lowered": []}
    ctx = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            pool.submit(streamed_decode, url, g.PROMPTS[0], banned, flag).result()  # warm-up
            for i in range(args.pairs):
                prompt = g.PROMPTS[i % len(g.PROMPTS)]
                decode["direct"].append(
                    worker.call(lambda e, pr=prompt: direct_decode(e, pr, banned, flag)).result()
                )
                for variant in ("base", "lowered") if i % 2 == 0 else ("lowered", "base"):
                    steps = args.nice if variant == "lowered" else 0
                    os.setpriority(os.PRIO_PROCESS, tid, base + steps)
                    _now[0] = variant
                    run = pool.submit(streamed_decode, url, prompt, banned, flag)
                    decode[variant].append(run.result())
    finally:
        os.setpriority(os.PRIO_PROCESS, tid, base)
        server.should_exit = True
        thread.join(30)
    report = {
        "benchmark": "loop_nice_paired",
        "command": "python benchmarks/loop_nice_paired.py " + " ".join(sys.argv[1:]),
        "decode_ms": {k: spread(v, 1e3) for k, v in decode.items()},
        "lowered_minus_base_decode_ms": spread(
            [b - a for a, b in zip(decode["base"], decode["lowered"], strict=True)], 1e3
        ),
        "token_to_loop_us": {
            k: {**spread(v, 1e6), "p90": round(1e6 * sorted(v)[int(0.9 * len(v))], 1)}
            for k, v in LAGS.items()
        },
        "load": os.getloadavg()[0],
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    sys.exit(main())
