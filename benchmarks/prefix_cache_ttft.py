"""Prefix cache through the gateway: TTFT per turn of a growing agent session, cold vs warm (L1)
vs after a restart (L2), with prefill tokens restored vs computed.

Starts `toolflash serve` three times on loopback (no cache; cache with a disk tier; a restart
on the same disk tier), drives the same multi-turn session (a large system prompt with tool
definitions, then user turns, tool calls and tool results that grow the transcript to several
thousand tokens) with the `openai` SDK, streaming, and reads TTFT from the first content chunk.

    python benchmarks/prefix_cache_ttft.py --shape opencode --turns 10 --out benchmarks/results
    python benchmarks/prefix_cache_ttft.py --shape opencode --turns 10 --scripted

By default the session is a real agent loop: each turn appends the model's own reply as the
client received it (its content and tool calls, as an openai-SDK loop appends `message`),
then a tool result per call (a 40-function file; a reply without a call gets the file in a
user message instead), then the next user message. `--scripted` replays a fixed assistant
tool call instead of the model's reply (the earlier form of this benchmark). Greedy decoding
and an exact cache make the three runs see the same transcript; the script checks it.

Two session shapes: `small` starts at ~2.2k prompt tokens (a short system prompt and ten short
tool definitions); `opencode` starts where OpenCode's first main request does (~7.4k tokens:
a long system prompt and ten tools with long descriptions, see shared/design-notes.md). Both
add about the same ~730 tokens per turn. A cache can at best skip what was seen before, so the
`floor` column (computed / prompt tokens) bounds the warm/cold ratio from below when a token's
cost does not depend on its position; `attn` is the bound when it grows with the position (all
attention, as in the tiny models at these lengths): 1 - (restored / prompt)^2. After the
restart a turn restores the longest snapshot of either tier, and the disk holds the first
server's snapshot at that turn's stable prefix (all of the prompt but the generation header),
so the restarted server computes a handful of tokens per turn (`L2 rest.` column). Server-side
times (arrival to first token, prefill) and tokens per cycle come from the `toolflash` object
of the usage chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from openai import OpenAI
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.registry import EMBEDDED_MODEL
from toolflash.ports import free_port

# The served model (`--model`): an embedded pair's id or a path; requests name it.
MODEL = EMBEDDED_MODEL

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{desc} Use it whenever the task needs it; arguments must follow "
            "the schema exactly and paths are relative to the repository root.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the repo."},
                    "query": {"type": "string", "description": "What to look for."},
                    "content": {"type": "string", "description": "Text to write."},
                    "limit": {"type": "integer", "description": "Maximum results."},
                },
                "required": ["path"],
            },
        },
    }
    for name, desc in [
        ("read_file", "Read a file."),
        ("write_file", "Write a file."),
        ("edit_file", "Replace text in a file."),
        ("list_dir", "List a directory."),
        ("grep", "Search files for a pattern."),
        ("run_shell", "Run a shell command."),
        ("run_tests", "Run the test suite."),
        ("git_diff", "Show the working tree diff."),
        ("git_commit", "Commit staged changes."),
        ("http_get", "Fetch a URL."),
    ]
]
SYSTEM = (
    "You are a coding agent working in a Python repository. Follow the user's instructions, "
    "use the tools to inspect and change files, keep changes small, run the tests after every "
    "change and report what you did. " * 12
)


# OpenCode-sized guidance: the system prompt and tool descriptions real agents send are long
# prose (rules, examples, caveats); these paragraphs stand in for them at a similar size.
GUIDANCE = [
    "Prefer small, reviewable edits. Before changing a file, read it and the tests that cover "
    "it, state what you will change and why, and keep unrelated formatting untouched.",
    "When a command fails, read the whole error, find the first failing frame that belongs to "
    "the repository, and fix the cause rather than the symptom; never silence a test.",
    "Use absolute clarity in commit messages: what changed, why it changed, and what you "
    "checked. Do not commit generated files, secrets or large binaries.",
    "Search before you write: reuse the helpers the repository already has, follow its naming "
    "and its error handling, and keep public interfaces stable unless asked to change them.",
    "Report results honestly. If something could not be verified, say so plainly and list the "
    "command that would verify it, instead of implying success.",
]


def opencode_shape() -> tuple[str, list[dict[str, Any]]]:
    """A system prompt and tools at OpenCode's measured size (~7.4k prompt tokens)."""
    system = (
        SYSTEM
        + "\n\n"
        + "\n\n".join(f"Rule {i + 1}. {GUIDANCE[i % len(GUIDANCE)]}" for i in range(30))
    )
    tools = []
    for k, t in enumerate(TOOLS):
        fn = dict(t["function"])
        fn["description"] = (
            fn["description"]
            + " "
            + " ".join(f"Note {j + 1}: {GUIDANCE[(j + k) % len(GUIDANCE)]}" for j in range(6))
        )
        tools.append({"type": "function", "function": fn})
    return system, tools


def start_server(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            *("-m", "toolflash.cli", "serve", "--port", str(port), "--model", MODEL, *args),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(300):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become ready")


def tool_result(i: int) -> str:
    """The tool output of turn `i`: a 40-function file (~650 tokens)."""
    return "\n".join(f"def function_{i}_{j}(x):\n    return x + {j}" for j in range(40))


def user_message(i: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Step {i}: open src/module_{i}.py and fix the bug."}


def session_turns(n: int, system: str = SYSTEM) -> list[list[dict[str, Any]]]:
    """The scripted session: the message lists of each turn (each extends the previous), with
    a fixed assistant tool call in place of the model's reply."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    turns = []
    for i in range(n):
        messages = messages + [user_message(i)]
        turns.append(messages)
        call_id = f"call_{i}"
        messages = messages + [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": f"src/module_{i}.py"}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": tool_result(i)},
        ]
    return turns


def follow_up(i: int, reply: dict[str, Any], user_turns: bool = True) -> list[dict[str, Any]]:
    """What an agent loop appends after turn `i`: the model's reply as received, a tool
    result per call (or the file as a user message when it called nothing), the next user
    message (without `user_turns`, only when the model called nothing: the loop goes on from
    the tool result, as agents do between two user messages)."""
    out: list[dict[str, Any]] = [reply]
    calls = reply.get("tool_calls") or []
    for call in calls:
        out.append({"role": "tool", "tool_call_id": call["id"], "content": tool_result(i)})
    if not calls:
        out.append({"role": "user", "content": f"src/module_{i}.py:\n{tool_result(i)}"})
    if user_turns or not calls:
        out.append(user_message(i + 1))
    return out


def stream_turn(
    client: OpenAI, messages: list[dict[str, Any]], max_tokens: int, tools: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One streamed request: (row of measurements, the assistant message as an SDK loop
    would append it)."""
    t0 = time.perf_counter()
    ttft = None
    usage = None
    info: dict[str, Any] = {}
    content = ""
    reasoning = ""
    calls: dict[int, dict[str, Any]] = {}
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    for chunk in stream:
        if chunk.choices:
            d = chunk.choices[0].delta
            r = getattr(d, "reasoning_content", None)
            if ttft is None and (d.content or d.tool_calls or r):
                ttft = time.perf_counter() - t0
            content += d.content or ""
            reasoning += r or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(
                    tc.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["function"]["name"] += tc.function.name or ""
                    call["function"]["arguments"] += tc.function.arguments or ""
        if chunk.usage:
            usage = chunk.usage
            info = (chunk.model_extra or {}).get("toolflash") or {}
    assert usage is not None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    timings = info.get("timings") or {}
    row = {
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": cached or 0,
        "computed_tokens": usage.prompt_tokens - (cached or 0),
        "completion_tokens": usage.completion_tokens,
        "ttft_s": round(ttft if ttft is not None else time.perf_counter() - t0, 4),
        "server_first_token_s": timings.get("ttft_s"),
        "server_prefill_s": timings.get("prefill_s"),
        "tokens_per_cycle": info.get("tokens_per_cycle"),
    }
    reply: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        reply["reasoning_content"] = reasoning
    if calls:
        reply["tool_calls"] = [calls[k] for k in sorted(calls)]
    return row, reply


def _without_ids(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply without its tool-call ids (random per response; the template never shows them)."""
    calls = [{**c, "id": ""} for c in reply.get("tool_calls") or []]
    return {**reply, "tool_calls": calls} if calls else reply


def replay_paired(
    base_ref: str,
    base_test: str,
    system: str,
    turns: int,
    max_tokens: int,
    tools: list[dict[str, Any]],
    scripted: bool,
    user_turns: bool = True,
    gap_s: float = 1.0,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Drive one session through two servers turn by turn: each turn goes to both, back to
    back, in alternating order, so a slow stretch of a shared machine lands on both sides of
    the ratio. The transcript continues from the reference server's reply (greedy decoding and
    an exact cache make the two replies equal; the caller checks). `gap_s` of idle time follow
    each request: an agent runs its tool between two turns, and the pause keeps one server's
    background snapshot write out of the other's measured request."""
    ref_client = OpenAI(base_url=f"{base_ref}/v1", api_key="none")
    test_client = OpenAI(base_url=f"{base_test}/v1", api_key="none")
    ref_rows: list[dict[str, Any]] = []
    test_rows: list[dict[str, Any]] = []
    scripted_turns = session_turns(turns, system) if scripted else []
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, user_message(0)]
    for i in range(turns):
        if scripted:
            messages = scripted_turns[i]
        order = [(ref_client, ref_rows), (test_client, test_rows)]
        replies = {}
        for client, rows in order if i % 2 == 0 else reversed(order):
            row, reply = stream_turn(client, messages, max_tokens, tools)
            row["turn"] = i + 1
            row["reply"] = reply
            rows.append(row)
            replies[id(rows)] = reply
            time.sleep(gap_s)
        if not scripted:
            messages = messages + follow_up(i, replies[id(ref_rows)], user_turns)
    return ref_rows, test_rows


def rss_mb(proc: subprocess.Popen[bytes]) -> float:
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server the way a user does (SIGTERM): the L2 writer flushes before it exits."""
    proc.terminate()
    proc.wait(timeout=60)


def run_once(
    args: argparse.Namespace, system: str, tools: list[dict[str, Any]], cold_base: str
) -> dict[str, Any]:
    """One repeat: cold vs warm (L1, with a disk tier) turn by turn, then cold vs a server
    restarted on that disk tier (L2), turn by turn."""
    session = dict(
        system=system,
        turns=args.turns,
        max_tokens=args.max_tokens,
        tools=tools,
        scripted=args.scripted,
        user_turns=not args.no_user_turns,
        gap_s=args.gap_s,
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as disk:
        cache_flags = ["--cache-dir", disk, "--policy", "off"]
        warm, warm_base = start_server(cache_flags)
        try:
            out["cold"], out["warm_l1"] = replay_paired(cold_base, warm_base, **session)
            out["warm_l1_rss_mb"] = round(rss_mb(warm), 1)
        finally:
            stop(warm)
        out["l2_disk_mb"] = round(sum(f.stat().st_size for f in Path(disk).iterdir()) / 1e6, 1)
        restarted, restart_base = start_server(cache_flags)
        try:
            out["cold_l2_pass"], out["restart_l2"] = replay_paired(
                cold_base, restart_base, **session
            )
            out["restart_l2_rss_mb"] = round(rss_mb(restarted), 1)
        finally:
            stop(restarted)
    out["same_transcript"] = all(
        c["prompt_tokens"] == t["prompt_tokens"]
        and _without_ids(c["reply"]) == _without_ids(t["reply"])
        for ref, test in (("cold", "warm_l1"), ("cold_l2_pass", "restart_l2"))
        for c, t in zip(out[ref], out[test], strict=True)
    ) and [_without_ids(r["reply"]) for r in out["cold"]] == [
        _without_ids(r["reply"]) for r in out["cold_l2_pass"]
    ]
    return out


def summarize(repeats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per turn: token counts, the median cold TTFT, and each tier's warm/cold TTFT ratio
    (paired within a repeat) as median, min and max over the repeats."""
    rows = []
    for t in range(len(repeats[0]["cold"])):
        first = repeats[0]["warm_l1"][t]
        restored_l2 = repeats[0]["restart_l2"][t]["cached_tokens"]
        l1 = [r["warm_l1"][t]["ttft_s"] / r["cold"][t]["ttft_s"] for r in repeats]
        l2 = [r["restart_l2"][t]["ttft_s"] / r["cold_l2_pass"][t]["ttft_s"] for r in repeats]
        prompt = first["prompt_tokens"]
        rows.append(
            {
                "turn": t + 1,
                "prompt_tokens": prompt,
                "restored_tokens": first["cached_tokens"],
                "computed_tokens": first["computed_tokens"],
                "restored_tokens_l2": restored_l2,
                "cold_ttft_s": statistics.median(
                    r[k][t]["ttft_s"] for r in repeats for k in ("cold", "cold_l2_pass")
                ),
                "l1_ratio": statistics.median(l1),
                "l1_ratio_range": [min(l1), max(l1)],
                "l2_ratio": statistics.median(l2),
                "l2_ratio_range": [min(l2), max(l2)],
                "tokens_per_cycle_cold": repeats[0]["cold"][t]["tokens_per_cycle"],
                "tokens_per_cycle_l1": first["tokens_per_cycle"],
                "tokens_per_cycle_l2": repeats[0]["restart_l2"][t]["tokens_per_cycle"],
                "floor": first["computed_tokens"] / prompt,
                "attn": 1 - (first["cached_tokens"] / prompt) ** 2,
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument(
        "--max-tokens", type=int, default=48, help="per turn (enough for a whole tool call)"
    )
    p.add_argument("--shape", choices=["small", "opencode"], default="opencode")
    p.add_argument(
        "--model", default=EMBEDDED_MODEL, help=f"served model (default {EMBEDDED_MODEL})"
    )
    p.add_argument("--repeats", type=int, default=3, help="whole sessions, each on fresh caches")
    p.add_argument(
        "--gap-s", type=float, default=1.0, help="idle seconds after each request (tool time)"
    )
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument(
        "--scripted",
        action="store_true",
        help="replay a fixed assistant tool call instead of the model's own reply",
    )
    p.add_argument(
        "--no-user-turns",
        action="store_true",
        help="after a tool call, continue from the tool result without a new user message",
    )
    args = p.parse_args()
    global MODEL
    MODEL = args.model
    system, tools = opencode_shape() if args.shape == "opencode" else (SYSTEM, TOOLS)
    results: dict[str, Any] = {
        "model": args.model,
        "shape": args.shape,
        "session": "scripted"
        if args.scripted
        else ("model_replies_no_user_turns" if args.no_user_turns else "model_replies"),
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "gap_s": args.gap_s,
        "design": "each turn goes to the cold server and the cached one back to back, in "
        "alternating order; ratios are paired within a repeat, medians over repeats",
    }
    cold, cold_base = start_server(["--no-cache", "--policy", "off"])
    runs = []
    try:
        for k in range(args.repeats):
            runs.append(run_once(args, system, tools, cold_base))
            print(f"repeat {k + 1}/{args.repeats} done", flush=True)
        results["cold_rss_mb"] = round(rss_mb(cold), 1)
    finally:
        stop(cold)
    results["same_transcript"] = all(r["same_transcript"] for r in runs) and all(
        [_without_ids(x["reply"]) for x in r["cold"]]
        == [_without_ids(x["reply"]) for x in runs[0]["cold"]]
        for r in runs
    )
    results["summary"] = summary = summarize(runs)
    results["runs"] = runs
    print(
        f"{'turn':>4} {'prompt':>6} {'restored':>8} {'computed':>8} {'L2 rest.':>8} | "
        f"{'cold TTFT':>9} | "
        f"{'L1 ratio':>8} {'(min-max)':>11} | {'L2 ratio':>8} {'(min-max)':>11} | "
        f"{'tau c/L1/L2':>14} | {'floor':>5} {'attn':>5}"
    )
    for row in summary:
        lo1, hi1 = row["l1_ratio_range"]
        lo2, hi2 = row["l2_ratio_range"]
        taus = "/".join(
            f"{row[k] or 0:.2f}"
            for k in ("tokens_per_cycle_cold", "tokens_per_cycle_l1", "tokens_per_cycle_l2")
        )
        print(
            f"{row['turn']:>4} {row['prompt_tokens']:>6} {row['restored_tokens']:>8} "
            f"{row['computed_tokens']:>8} {row['restored_tokens_l2']:>8} | "
            f"{row['cold_ttft_s']:>9.3f} | "
            f"{row['l1_ratio']:>8.3f} {lo1:>5.2f}-{hi1:<5.2f} | {row['l2_ratio']:>8.3f} "
            f"{lo2:>5.2f}-{hi2:<5.2f} | {taus:>14} | {row['floor']:>5.2f} {row['attn']:>5.2f}"
        )
    print(
        f"RSS MB: cold {results['cold_rss_mb']}, L1 {runs[0]['warm_l1_rss_mb']}, after restart "
        f"{runs[0]['restart_l2_rss_mb']}; L2 on disk {runs[0]['l2_disk_mb']} MB; same "
        f"transcript in every run: {results['same_transcript']}"
    )
    os.makedirs(args.out, exist_ok=True)
    # The default session keeps the file names of earlier runs; variants get a suffix.
    suffix = {"model_replies": "", "scripted": "_scripted"}.get(
        results["session"], "_no_user_turns"
    )
    shape = "" if args.shape == "small" else f"_{args.shape}"
    model = "" if args.model == EMBEDDED_MODEL else f"_{Path(args.model).name}"
    name = f"prefix_cache_ttft{shape}{suffix}{model}.json"
    Path(args.out, name).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
