"""A mixed coding-agent workload through the engine: always-spec, always-AR and the adaptive policy,
in one run, interleaved request by request.

The workload (below, in this file) is a set of multi-turn sessions: tool definitions, tool calls and
tool results, free text, code, forced tool calls and JSON-schema answers, with thinking on and off.
Every assistant turn of a session becomes one request whose prompt is the session so far, classified
with the gateway's request classifier. Each request runs under the three strategies back to back
(in balanced orders, so drift, neighbours' load and carry-over spread evenly); greedy decoding makes
the three outputs identical, which is checked. Decode time (the engine's `decode_s`, and the
process CPU time of the decode phase) and tokens are summed per request class and overall (see
MEASURES). A second AR run per request (`ar-again`) shows the noise floor.

    OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \
        flock /tmp/bench.lock python benchmarks/agent_workload.py --rounds 24 \
        [--model DIR --draft DIR] [--out DIR] [--classes CLASS ...]

(24-32 rounds is what the published results use, with 3-6 requests per class: per-class figures
over one or two requests were noise on a shared machine; the `noise` column, ar-again vs ar, says
how noisy. Requests whose decode takes under `--short-ms` run `--short-repeats` times a round:
a single run of a 30 ms request varies by ~20% here, so their medians need more runs. The repeats
run the policy on a throwaway copy of its state, so it learns from the same workload.) Each row
also counts the grammar-forced cycles (`forced_cycles`, `forced_tokens`: forced runs verified without drafting).

Writes `agent_workload.json` and `agent_workload.png` (tok/s per class per strategy) to --out.
The bar (issue 5): adaptive within 3% of the better fixed mode on every class, and faster than both
on the whole workload.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from toolflash.engine.api import FinishEvent, GenerationRequest, OutputConstraint, TokenEvent
from toolflash.gateway.logs import configure_logging
from toolflash.gateway.protocol import ChatCompletionRequest
from toolflash.gateway.structured import build_constraint, for_prompt, reasoning_mode
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig
from toolflash.policy.controller import PolicyController
from toolflash.policy.request_class import RequestClass, classify

STRATEGIES = ("spec", "ar", "adaptive")
# A second AR run of every request: how far two identical strategies differ is the noise floor.
CONTROL = "ar-again"
BAR = 0.03

# -- the workload -------------------------------------------------------------------------------
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file from the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the repository root and return its output.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "integer"},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_code",
            "description": "Search the code base for a regular expression.",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "glob": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Replace a file's content.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]

UTILS_PY = '''def parse_size(text):
    """Parse '10k', '3M' or '512' into a number of bytes."""
    units = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    text = text.strip().lower()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)
'''

PYTEST_OUT = """============================= test session starts ==============================
collected 12 items

tests/test_utils.py ..F.........                                          [100%]

=================================== FAILURES ===================================
______________________________ test_parse_size_b _______________________________
    def test_parse_size_b():
>       assert parse_size("512b") == 512
E       ValueError: invalid literal for int() with base 10: '512b'
=========================== 1 failed, 11 passed in 0.04s ==========================="""

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "dependencies": {"type": "array", "items": {"type": "string"}},
        "license": {"type": "string"},
    },
    "required": ["name", "version", "dependencies", "license"],
    "additionalProperties": False,
}


ISSUE_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "severity": {"type": "string", "enum": ["low", "medium", "high"]},
        "labels": {"type": "array", "items": {"type": "string"}},
        "files": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "severity", "labels", "files"],
    "additionalProperties": False,
}


def call(name: str, arguments: Mapping[str, Any], i: int) -> dict[str, Any]:
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": dict(arguments)},
    }


@dataclass
class Session:
    """A conversation; every assistant message in `turns` is a point where we generate."""

    name: str
    turns: list[dict[str, Any]]
    tools: bool = True
    tool_choice: str = "auto"
    response_format: str | None = None
    schema: dict[str, Any] | None = None  # the json_schema of a `response_format` session
    thinking: bool | None = False
    system: str = "You are a careful coding agent working in a Python repository."
    requests: list[dict[str, Any]] = field(default_factory=list)


SESSIONS: list[Session] = [
    Session(
        "fix-failing-test",
        [
            {
                "role": "user",
                "content": "The test suite fails. Find the bug in src/utils.py and fix it.",
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("run_shell", {"command": "python -m pytest -q"}, 1)],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": PYTEST_OUT},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("read_file", {"path": "src/utils.py"}, 2)],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": UTILS_PY},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call(
                        "write_file",
                        {
                            "path": "src/utils.py",
                            "content": UTILS_PY.replace(
                                '"g": 1024 ** 3}', '"g": 1024 ** 3, "b": 1}'
                            ),
                        },
                        3,
                    )
                ],
            },
            {"role": "tool", "tool_call_id": "call_3", "content": "ok"},
            {
                "role": "assistant",
                "content": "The parser did not know the `b` suffix; I added it as a unit of one byte, so `parse_size('512b')` now returns 512.",
            },
        ],
    ),
    Session(
        "explore-repo",
        [
            {"role": "user", "content": "Where is the retry logic for HTTP requests implemented?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("search_code", {"pattern": "def retry", "glob": "**/*.py"}, 1)],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": "src/http/client.py:41:def retry(fn, attempts=3, backoff=0.5):\nsrc/http/client.py:88:    @retry",
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("read_file", {"path": "src/http/client.py"}, 2)],
            },
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": "import time\n\n\ndef retry(fn, attempts=3, backoff=0.5):\n    def wrapper(*args, **kwargs):\n        for i in range(attempts):\n            try:\n                return fn(*args, **kwargs)\n            except OSError:\n                time.sleep(backoff * 2 ** i)\n        return fn(*args, **kwargs)\n    return wrapper\n",
            },
            {
                "role": "assistant",
                "content": "Retries live in `src/http/client.py`: `retry` wraps a function, catches `OSError` and sleeps `backoff * 2 ** i` between attempts, then makes one last unguarded call.",
            },
        ],
    ),
    Session(
        "forced-tool",
        [
            {"role": "user", "content": "List the Python files under src/ with their sizes."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("run_shell", {"command": "find src -name '*.py' -exec wc -c {} +"}, 1)
                ],
            },
        ],
        tool_choice="required",
    ),
    Session(
        "package-json",
        [
            {
                "role": "user",
                "content": 'Read this and answer with the package metadata as JSON.\n\n[project]\nname = "toolflash"\nversion = "0.1.0"\ndependencies = ["mlx", "mlx-lm", "starlette"]\nlicense = "Apache-2.0"',
            },
            {
                "role": "assistant",
                "content": json.dumps(
                    {
                        "name": "toolflash",
                        "version": "0.1.0",
                        "dependencies": ["mlx", "mlx-lm", "starlette"],
                        "license": "Apache-2.0",
                    }
                ),
            },
        ],
        tools=False,
        response_format="json_schema",
        schema=SCHEMA,
    ),
    Session(
        "write-code",
        [
            {
                "role": "user",
                "content": "Write a Python function that merges two sorted lists into one sorted list.",
            },
            {
                "role": "assistant",
                "content": "```python\ndef merge(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n```",
            },
            {"role": "user", "content": "Now explain its complexity in two sentences."},
            {
                "role": "assistant",
                "content": "Each element is appended once, so the merge runs in O(len(a) + len(b)) time. It builds a new list, so it also uses linear extra memory.",
            },
        ],
        tools=False,
    ),
    Session(
        "think-then-call",
        [
            {
                "role": "user",
                "content": "Check whether the config file config/app.yaml sets a debug flag.",
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("read_file", {"path": "config/app.yaml"}, 1)],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": "server:\n  port: 8080\n  debug: true\nlogging:\n  level: info\n",
            },
            {
                "role": "assistant",
                "content": "Yes: `server.debug` is `true` in config/app.yaml; set it to `false` for production.",
            },
        ],
        thinking=True,
    ),
    # More requests for the classes above that had one or two, so that per-class totals are
    # not one request's luck on a noisy machine.
    Session(
        "add-test",
        [
            {"role": "user", "content": "Add a test for parse_size('2k') to tests/test_utils.py."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call(
                        "write_file",
                        {
                            "path": "tests/test_utils_size.py",
                            "content": "from src.utils import parse_size\n\n\n"
                            "def test_parse_size_k():\n    assert parse_size('2k') == 2048\n",
                        },
                        1,
                    )
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "wrote 96 bytes"},
            {
                "role": "assistant",
                "content": "Added `tests/test_utils_size.py` with `test_parse_size_k`, which checks that `parse_size('2k')` returns 2048.",
            },
        ],
    ),
    Session(
        "forced-read",
        [
            {"role": "user", "content": "Show me the README of this repository."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("read_file", {"path": "README.md"}, 1)],
            },
        ],
        tool_choice="required",
    ),
    Session(
        "forced-search",
        [
            {"role": "user", "content": "Which modules import the logging package?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("search_code", {"pattern": "^import logging", "glob": "src/**/*.py"}, 1)
                ],
            },
        ],
        tool_choice="required",
    ),
    Session(
        "issue-json",
        [
            {
                "role": "user",
                "content": "Triage this bug report as JSON.\n\nTitle: parse_size crashes on '512b'\nBody: Calling parse_size('512b') raises ValueError instead of returning 512. Seen in src/utils.py on main.",
            },
            {
                "role": "assistant",
                "content": json.dumps(
                    {
                        "title": "parse_size crashes on '512b'",
                        "severity": "medium",
                        "labels": ["bug", "parsing"],
                        "files": ["src/utils.py"],
                    }
                ),
            },
        ],
        tools=False,
        response_format="json_schema",
        schema=ISSUE_SCHEMA,
    ),
    Session(
        "deps-json",
        [
            {
                "role": "user",
                "content": "List the runtime dependencies in this requirements file as a JSON object mapping each name to its version.\n\nhttpx==0.27.0\npydantic==2.7.1\nrich==13.7.1",
            },
            {
                "role": "assistant",
                "content": json.dumps({"httpx": "0.27.0", "pydantic": "2.7.1", "rich": "13.7.1"}),
            },
        ],
        tools=False,
        response_format="json_object",
    ),
    Session(
        "explain-code",
        [
            {
                "role": "user",
                "content": "What does this function do?\n\n" + UTILS_PY,
            },
            {
                "role": "assistant",
                "content": "It turns a size such as '10k', '3M' or '512' into a number of bytes: a trailing k, m or g multiplies by 1024, 1024 ** 2 or 1024 ** 3, and a plain number is returned as an integer.",
            },
            {"role": "user", "content": "Write a docstring example for it."},
            {
                "role": "assistant",
                "content": '```python\n>>> parse_size("10k")\n10240\n>>> parse_size("512")\n512\n```',
            },
        ],
        tools=False,
    ),
    Session(
        "think-grep",
        [
            {"role": "user", "content": "Is the function load_config still used anywhere?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("search_code", {"pattern": "load_config\\("}, 1)],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": "src/app.py:12:    cfg = load_config(path)\nsrc/config.py:5:def load_config(path):",
            },
            {
                "role": "assistant",
                "content": "Yes: `src/app.py` calls `load_config(path)` on line 12; it is defined in `src/config.py`.",
            },
        ],
        thinking=True,
    ),
    Session(
        "think-run-tests",
        [
            {
                "role": "user",
                "content": "Run the tests for the utils module and tell me the result.",
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("run_shell", {"command": "pytest tests/test_utils.py -q"}, 1)],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": PYTEST_OUT},
            {
                "role": "assistant",
                "content": "One of 12 tests fails: `test_parse_size_b`, because `parse_size('512b')` raises ValueError; the other 11 pass.",
            },
        ],
        thinking=True,
    ),
]


@dataclass(frozen=True)
class WorkItem:
    session: str
    turn: int
    prompt: tuple[int, ...]
    request_class: RequestClass
    json_output: bool
    start_in_reasoning: bool
    # The grammar the gateway would enforce (response_format, forced tool calls), or None.
    constraint: OutputConstraint | None = None


def session_constraint(s: Session, tools: list[dict[str, Any]] | None) -> OutputConstraint | None:
    """The constraint the gateway builds for this session's requests (before binding to a
    prompt); it depends on tools, tool_choice and response_format, not on the messages."""
    body: dict[str, Any] = {"model": "bench", "messages": [{"role": "user", "content": "-"}]}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = s.tool_choice
    if s.response_format == "json_schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": s.name.replace("-", "_"), "schema": s.schema, "strict": True},
        }
    elif s.response_format is not None:
        body["response_format"] = {"type": s.response_format}
    return build_constraint(ChatCompletionRequest.model_validate(body))


def build_workload(engine: Any) -> list[WorkItem]:
    """One request per assistant turn: the prompt is the conversation before it."""
    items: list[WorkItem] = []
    for s in SESSIONS:
        history: list[dict[str, Any]] = [{"role": "system", "content": s.system}]
        tools = TOOLS if s.tools else None
        kwargs = {} if s.thinking is None else {"enable_thinking": s.thinking}
        for i, message in enumerate(s.turns):
            if message["role"] == "assistant":
                prompt = engine.encode_chat(history, tools, kwargs)
                cls = classify(
                    tools_offered=tools is not None,
                    tool_choice=s.tool_choice,
                    response_format=s.response_format,
                    enable_thinking=s.thinking,
                    last_role=history[-1]["role"],
                    prompt_tokens=len(prompt),
                )
                tail = engine.decode(prompt[-8:])
                in_reasoning = tail.rstrip().endswith("<think>")
                constraint = session_constraint(s, tools)
                if constraint is not None:
                    reasoning = reasoning_mode(tail, s.thinking, in_reasoning)
                    constraint = for_prompt(constraint, engine.tool_call_format, reasoning)
                items.append(
                    WorkItem(
                        s.name,
                        i,
                        tuple(prompt),
                        cls,
                        s.response_format is not None,
                        in_reasoning,
                        constraint,
                    )
                )
            history.append(message)
    return items


# -- running ------------------------------------------------------------------------------------
@dataclass
class Result:
    tokens: list[int]
    decode_s: float
    cpu_s: float
    completion_tokens: int
    cycles: int
    spec_cycles: int
    forced_cycles: int = 0
    forced_tokens: int = 0
    summary: dict[str, Any] | None = None


def generate(
    engine: Any, item: WorkItem, strategy: str, max_tokens: int, policy: AdaptivePolicy
) -> Result:
    controller: PolicyController | None = None
    mode = "spec" if strategy == "spec" else "ar"  # "ar" and the "ar-again" control
    if strategy == "adaptive":
        mode = "spec"
        controller = policy.controller_for(
            engine.model_id,
            item.request_class,
            item.json_output,
            start_in_reasoning=item.start_in_reasoning,
        )
    request = GenerationRequest(item.prompt, max_tokens, mode=mode, constraint=item.constraint)
    tokens: list[int] = []
    finish: FinishEvent | None = None
    cpu0 = 0.0
    for event in engine.generate(request, None, controller):
        if isinstance(event, TokenEvent):
            if not tokens:
                # Decoding starts after the prefill's token.
                cpu0 = time.process_time()
            tokens.extend(event.token_ids)
        else:
            finish = event
    cpu_s = time.process_time() - cpu0
    assert finish is not None
    st = finish.stats
    return Result(
        tokens,
        st.decode_s,
        cpu_s,
        st.completion_tokens,
        len(st.cycles),
        st.spec_cycles,
        sum(1 for c in st.cycles if c.forced),
        sum(c.forced for c in st.cycles),
        controller.summary() if controller is not None else None,
    )


def balanced_orders(n: int) -> list[list[int]]:
    """A Williams design: n orders (2n for odd n) in which every strategy runs in every position
    equally often and follows every other strategy equally often, so carry-over between
    consecutive runs cannot favour one strategy."""
    first = [0]
    lo, hi = 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [list(reversed(r)) for r in rows]
    return rows


def class_name(cls: RequestClass) -> str:
    """Reporting group: the label without its length band (every prompt here is short)."""
    return cls.label.rsplit(".", 1)[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import mlx.core as mx

    from toolflash.engine.factory import build_engine

    engine = build_engine(args.model, args.draft, block_size=args.block_size)
    workload = build_workload(engine)
    if args.classes:
        workload = [w for w in workload if class_name(w.request_class) in args.classes]
        if not workload:
            raise SystemExit(f"no request of classes {args.classes} in the workload")
    state = Path(args.state_file) if args.state_file else Path(tempfile.mkdtemp()) / "state.json"
    policy = AdaptivePolicy(PolicyConfig(args.policy or []), state_file=str(state))
    # Warm up both paths (first calls compile and allocate); not measured.
    warm = GenerationRequest(workload[0].prompt, 16)
    for mode in ("spec", "ar"):
        list(engine.generate(GenerationRequest(warm.prompt_tokens, 16, mode=mode)))

    strategies = STRATEGIES + ((CONTROL,) if args.control else ())
    orders = balanced_orders(len(strategies))
    repeats = short_repeats(engine, workload, args)
    rows: list[dict[str, Any]] = []
    mismatches = 0
    t0 = time.perf_counter()
    n = 0
    for rnd in range(args.rounds):
        # Short requests' extra passes come after the round's first pass, not back to back.
        passes = max(repeats, default=1)
        for pass_, item in (
            (p, w) for p in range(passes) for w, k in zip(workload, repeats) if k > p
        ):
            order = [strategies[i] for i in orders[n % len(orders)]]
            n += 1
            results = {}
            # A repeat pass runs the policy on a copy of its state, dropped afterwards: the
            # policy learns from the workload's first pass only, so the repeats measure it
            # without changing the mix of requests it learns from (three times as many short
            # tool results would pull their class's estimates toward spec for all of them).
            learned = policy.learned() if pass_ > 0 else None
            for s in order:
                # Every run starts from the same allocator state, whatever ran before it.
                gc.collect()
                mx.clear_cache()
                results[s] = generate(engine, item, s, args.max_tokens, policy)
            if learned is not None:
                policy.restore(learned)
            if len({tuple(r.tokens) for r in results.values()}) != 1:
                mismatches += 1
            for s, r in results.items():
                rows.append(
                    {
                        "round": rnd,
                        "pass": pass_,
                        "session": item.session,
                        "turn": item.turn,
                        "class": class_name(item.request_class),
                        "label": item.request_class.label,
                        "strategy": s,
                        "prompt_tokens": len(item.prompt),
                        "completion_tokens": r.completion_tokens,
                        "decode_s": r.decode_s,
                        "cpu_s": r.cpu_s,
                        "cycles": r.cycles,
                        "spec_cycles": r.spec_cycles,
                        "forced_cycles": r.forced_cycles,
                        "forced_tokens": r.forced_tokens,
                        "policy": r.summary,
                    }
                )
    wall = time.perf_counter() - t0
    policy.save()
    return report(engine, args, rows, mismatches, wall, str(state), policy)


def short_repeats(engine: Any, workload: Sequence[WorkItem], args: argparse.Namespace) -> list[int]:
    """Runs per round for each request: `--short-repeats` for requests whose always-spec decode
    (one calibration run, not measured) is under `--short-ms`, else 1. A 30 ms request's run
    time varies by ~20% on a shared machine, so its median over the rounds alone is uncertain
    by several percent, more than the 3% the bar resolves; the extra runs cost little."""
    if args.short_repeats <= 1:
        return [1] * len(workload)
    out = []
    for item in workload:
        request = GenerationRequest(item.prompt, args.max_tokens, constraint=item.constraint)
        finish = [e for e in engine.generate(request) if isinstance(e, FinishEvent)][0]
        out.append(args.short_repeats if finish.stats.decode_s * 1e3 < args.short_ms else 1)
    return out


def aggregate(
    rows: Sequence[Mapping[str, Any]], key: str | None, statistic: str, time_key: str
) -> dict[str, dict[str, dict[str, float]]]:
    """Per group and strategy: tokens, seconds (`time_key` of each run) and tok/s. `statistic`
    "mean" takes each request's mean time over all its runs (every run counts, a burst too) and
    adds those; "median" takes each request's median time (robust to other processes' bursts
    on a shared machine) and adds those; "paired" see `paired`. A request counts once whatever
    its number of runs (short requests run more, `short_repeats`)."""
    if statistic == "paired":
        return paired(rows, key, time_key)
    runs: dict[tuple[str, str, str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        group = r[key] if key else "overall"
        runs.setdefault((group, r["strategy"], r["session"], r["turn"]), []).append(r)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (group, strategy, _, _), rs in runs.items():
        cell = out.setdefault(group, {}).setdefault(strategy, {"tokens": 0, "seconds": 0.0})
        if statistic == "median":
            cell["tokens"] += rs[0]["completion_tokens"]
            cell["seconds"] += statistics.median(r[time_key] for r in rs)
        else:
            cell["tokens"] += rs[0]["completion_tokens"]
            cell["seconds"] += statistics.fmean(r[time_key] for r in rs)
    for strategies in out.values():
        for cell in strategies.values():
            cell["tok_s"] = cell["tokens"] / cell["seconds"] if cell["seconds"] > 0 else 0.0
    return out


def paired(
    rows: Sequence[Mapping[str, Any]], key: str | None, time_key: str
) -> dict[str, dict[str, dict[str, float]]]:
    """Per group: each strategy's time as a ratio to AR's in the same round (the runs of one
    request are back to back, so a slow stretch of the machine hits all strategies of that
    round alike and cancels in the ratio), the median ratio over the rounds, times AR's median
    round time. Each round's group time sums its requests (a request's mean over its runs in
    the round)."""
    runs: dict[tuple[str, int, str, str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        group = r[key] if key else "overall"
        runs.setdefault((group, r["round"], r["strategy"], r["session"], r["turn"]), []).append(r)
    rounds: dict[tuple[str, int], dict[str, list[float]]] = {}
    for (group, rnd, strategy, _, _), rs in runs.items():
        cell = rounds.setdefault((group, rnd), {}).setdefault(strategy, [0, 0.0])
        cell[0] += rs[0]["completion_tokens"]
        cell[1] += statistics.fmean(r[time_key] for r in rs)
    groups: dict[str, list[dict[str, list[float]]]] = {}
    for (group, _), strategies in sorted(rounds.items()):
        if "ar" in strategies and strategies["ar"][1] > 0:
            groups.setdefault(group, []).append(strategies)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for group, per_round in groups.items():
        base = statistics.median(st["ar"][1] for st in per_round)
        for strategy in per_round[0]:
            present = [st for st in per_round if strategy in st]
            ratio = statistics.median(st[strategy][1] / st["ar"][1] for st in present)
            tokens = statistics.median(st[strategy][0] for st in present)
            seconds = base * ratio
            out.setdefault(group, {})[strategy] = {
                "tokens": tokens,
                "seconds": seconds,
                "tok_s": tokens / seconds if seconds > 0 else 0.0,
            }
    return out


# Ways to read the same runs. Wall-clock decode time (the engine's decode_s) is what a client
# sees; on a shared machine, other processes' bursts land on single runs, so the median over the
# rounds is the headline; "paired" compares strategies within each round first (ratios to AR),
# which also cancels slow stretches that last a whole round. Process CPU time of the decode
# phase is not charged while another process runs (valid with single-threaded BLAS:
# OPENBLAS_NUM_THREADS=1), so it shows the decoding cost with the neighbours' noise removed.
# "all runs" counts every run (each request's mean), cold start included.
MEASURES: dict[str, tuple[str, str]] = {
    "wall_median": ("decode_s", "median"),
    "wall_paired": ("decode_s", "paired"),
    "cpu_median": ("cpu_s", "median"),
    "wall_all_runs": ("decode_s", "mean"),
}


def measure(rows: Sequence[Mapping[str, Any]], time_key: str, statistic: str) -> dict[str, Any]:
    per_class = aggregate(rows, "class", statistic, time_key)
    overall = aggregate(rows, None, statistic, time_key)["overall"]
    verdicts = {c: verdict(v) for c, v in per_class.items()}
    total = verdict(overall)
    noise = {
        c: v[CONTROL]["tok_s"] / v["ar"]["tok_s"] - 1.0
        for c, v in {**per_class, "overall": overall}.items()
        if CONTROL in v and v["ar"]["tok_s"] > 0
    }
    return {
        "per_class": per_class,
        "overall": overall,
        "noise_floor_ar_again_vs_ar": noise,
        "verdict": {
            "per_class": verdicts,
            "overall": total,
            "bar_met": all(v["within_bar"] for v in verdicts.values()) and total["beats_both"],
        },
    }


def verdict(cells: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    best_fixed = max(cells["spec"]["tok_s"], cells["ar"]["tok_s"])
    adaptive = cells["adaptive"]["tok_s"]
    return {
        "best_fixed": "spec" if cells["spec"]["tok_s"] >= cells["ar"]["tok_s"] else "ar",
        "adaptive_vs_best_fixed": adaptive / best_fixed - 1.0 if best_fixed > 0 else 0.0,
        "within_bar": adaptive >= best_fixed * (1.0 - BAR),
        "beats_both": adaptive > best_fixed,
    }


def report(
    engine: Any,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    mismatches: int,
    wall: float,
    state: str,
    policy: AdaptivePolicy,
) -> dict[str, Any]:
    import mlx.core as mx

    return {
        "benchmark": "agent_workload",
        "model": engine.model_id,
        "draft": engine.draft_id,
        "block_size": engine.default_block_size,
        # Always-spec runs the engine's default draft length (adaptive: the block shrinks
        # after rejected drafts); the adaptive policy decides its blocks itself.
        "spec_draft_length": engine.options.draft_length,
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "mlx": getattr(mx, "__version__", "?"),
            "device": str(mx.default_device()),
        },
        "rounds": args.rounds,
        "classes": args.classes or "all",
        "max_tokens": args.max_tokens,
        "requests": len({(r["round"], r["session"], r["turn"]) for r in rows}),
        "runs_per_strategy": sum(1 for r in rows if r["strategy"] == "adaptive"),
        "short_repeats": args.short_repeats,
        "short_ms": args.short_ms,
        "wall_s": wall,
        "outputs_identical": mismatches == 0,
        "mismatched_requests": mismatches,
        "measures": {name: measure(rows, *spec) for name, spec in MEASURES.items()},
        "policy_state": state,
        "policy_counters": policy.counters(),
        "rows": rows,
    }


def format_report(rep: Mapping[str, Any]) -> str:
    lines = [
        f"model {rep['model']}  draft {rep['draft']}  block {rep['block_size']}  "
        f"{rep['requests']} requests ({rep['rounds']} rounds; requests under "
        f"{rep['short_ms']:.0f} ms run {rep['short_repeats']}x a round, "
        f"{rep['runs_per_strategy']} runs a strategy), max_tokens {rep['max_tokens']}, "
        f"outputs identical: {rep['outputs_identical']}",
    ]
    for name, m in rep["measures"].items():
        lines.append(
            f"\n[{name}] {'class':<34}{'spec tok/s':>11}{'ar tok/s':>10}{'adaptive':>10}"
            f"{'vs best':>9}{'noise':>8}  bar"
        )
        groups = {**m["per_class"], "overall": m["overall"]}
        verdicts = {**m["verdict"]["per_class"], "overall": m["verdict"]["overall"]}
        pad = " " * (len(name) + 3)
        for group, cells in groups.items():
            v = verdicts[group]
            ok = v["beats_both"] if group == "overall" else v["within_bar"]
            lines.append(
                f"{pad}{group:<34}{cells['spec']['tok_s']:>11.1f}{cells['ar']['tok_s']:>10.1f}"
                f"{cells['adaptive']['tok_s']:>10.1f}{v['adaptive_vs_best_fixed']:>+9.1%}"
                f"{m['noise_floor_ar_again_vs_ar'].get(group, float('nan')):>+8.1%}  "
                f"{'ok' if ok else 'MISSED'}"
            )
        o = m["overall"]
        lines.append(
            f"{pad}seconds: spec {o['spec']['seconds']:.2f}, ar {o['ar']['seconds']:.2f}, "
            f"adaptive {o['adaptive']['seconds']:.2f}; bar met: {m['verdict']['bar_met']}"
        )
    return "\n".join(lines)


def plot(rep: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = ("wall_median", "cpu_median")
    fig, axes = plt.subplots(len(measures), 1, figsize=(11.0, 4.2 * len(measures)))
    for ax, name in zip(axes, measures):
        m = rep["measures"][name]
        groups = {**m["per_class"], "overall": m["overall"]}
        names = list(groups)
        width = 0.27
        for k, strategy in enumerate(STRATEGIES):
            xs = [i + (k - 1) * width for i in range(len(names))]
            ax.bar(xs, [groups[n][strategy]["tok_s"] for n in names], width, label=strategy)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=15, ha="right", fontsize=8)
        ax.set_ylabel("decode tokens / s")
        ax.set_title(f"{name.replace('_', ', ')}", fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Agent workload: {Path(str(rep['model'])).name} + {Path(str(rep['draft'])).name}, "
        f"block {rep['block_size']} (spec: {rep.get('spec_draft_length', 'fixed')} draft "
        f"length), {rep['rounds']} rounds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _devnull() -> TextIO:
    return open(os.devnull, "w")  # noqa: SIM115 (kept open for the logging thread)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target (default: the embedded tiny pair)")
    p.add_argument("--draft", default=None, help="DFlash drafter for --model")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=5, help="passes over the workload")
    p.add_argument(
        "--short-repeats",
        type=int,
        default=3,
        help="runs per round of a request whose always-spec decode is under --short-ms",
    )
    p.add_argument("--short-ms", type=float, default=100.0)
    p.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="skip the second AR run per request that measures the noise floor",
    )
    p.add_argument(
        "--classes",
        nargs="*",
        help="run only these classes (e.g. tools.think-off.tool-result): for quick looks; "
        "the published results run all",
    )
    p.add_argument("--policy", nargs="*", help="extra policy YAML files")
    p.add_argument("--state-file", default=None, help="policy state (default: fresh, cold start)")
    p.add_argument("--out", default="benchmarks/results", help="folder for the JSON and PNG")
    p.add_argument("--verbose", action="store_true", help="log every policy decision")
    args = p.parse_args(argv)
    # Logging as `toolflash serve` does it (info, JSON lines, rendered off the decode path), so
    # the adaptive runs pay what a served request pays for its decision lines; --verbose shows
    # them, otherwise they go nowhere (they are in the JSON).
    configure_logging(
        json_lines=not args.verbose, level="info", stream=None if args.verbose else _devnull()
    )
    rep = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_workload.json").write_text(json.dumps(rep, indent=1))
    plot(rep, out / "agent_workload.png")
    print(format_report(rep))
    print(f"wrote {out / 'agent_workload.json'} and {out / 'agent_workload.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
