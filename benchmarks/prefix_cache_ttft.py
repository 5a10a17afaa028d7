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
attention, as in the tiny models at these lengths): 1 - (restored / prompt)^2. Server-side
times (arrival to first token, prefill) and tokens per cycle come from the `toolflash` object
of the usage chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolflash.cli", "serve", "--port", str(port), *args],
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
        model="toolflash-tiny-qwen3",
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


def replay(
    base: str,
    system: str,
    turns: int,
    max_tokens: int,
    tools: list[dict[str, Any]],
    scripted: bool,
    user_turns: bool = True,
) -> list[dict[str, Any]]:
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    rows = []
    scripted_turns = session_turns(turns, system) if scripted else []
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, user_message(0)]
    for i in range(turns):
        if scripted:
            messages = scripted_turns[i]
        row, reply = stream_turn(client, messages, max_tokens, tools)
        row["turn"] = i + 1
        row["reply"] = reply
        rows.append(row)
        if not scripted:
            messages = messages + follow_up(i, reply, user_turns)
    return rows


def rss_mb(proc: subprocess.Popen[bytes]) -> float:
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument(
        "--max-tokens", type=int, default=48, help="per turn (enough for a whole tool call)"
    )
    p.add_argument("--shape", choices=["small", "opencode"], default="opencode")
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
    system, tools = opencode_shape() if args.shape == "opencode" else (SYSTEM, TOOLS)
    results: dict[str, Any] = {
        "shape": args.shape,
        "session": "scripted"
        if args.scripted
        else ("model_replies_no_user_turns" if args.no_user_turns else "model_replies"),
        "turns": args.turns,
        "max_tokens": args.max_tokens,
    }
    with tempfile.TemporaryDirectory() as disk:
        for name, flags in [
            ("cold", ["--no-cache", "--policy", "off"]),
            ("warm_l1", ["--cache-dir", disk, "--policy", "off"]),
            ("restart_l2", ["--cache-dir", disk, "--policy", "off"]),
        ]:
            proc, base = start_server(flags)
            try:
                results[name] = replay(
                    base,
                    system,
                    args.turns,
                    args.max_tokens,
                    tools,
                    args.scripted,
                    user_turns=not args.no_user_turns,
                )
                results[f"{name}_rss_mb"] = round(rss_mb(proc), 1)
                if name == "warm_l1":
                    time.sleep(2)  # let the L2 writer finish before the restart
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            if name == "warm_l1":
                results["l2_disk_mb"] = round(
                    sum(f.stat().st_size for f in Path(disk).iterdir()) / 1e6, 1
                )
    same = [
        c["prompt_tokens"] == w["prompt_tokens"] == r["prompt_tokens"]
        and _without_ids(c["reply"]) == _without_ids(w["reply"]) == _without_ids(r["reply"])
        for c, w, r in zip(results["cold"], results["warm_l1"], results["restart_l2"], strict=True)
    ]
    results["same_transcript"] = all(same)
    print(
        f"{'turn':>4} {'prompt':>6} | {'cold TTFT':>9} {'tau':>5} | {'L1 TTFT':>8} {'ratio':>5} "
        f"{'restored':>8} {'computed':>8} {'tau':>5} | {'L2 TTFT':>8} {'ratio':>5} {'restored':>8} "
        f"{'tau':>5} | {'floor':>5} {'attn':>5}"
    )
    for c, w, r in zip(results["cold"], results["warm_l1"], results["restart_l2"], strict=True):
        print(
            f"{c['turn']:>4} {c['prompt_tokens']:>6} | {c['ttft_s']:>9.3f} "
            f"{c['tokens_per_cycle'] or 0:>5.2f} | {w['ttft_s']:>8.3f} "
            f"{w['ttft_s'] / c['ttft_s']:>5.2f} {w['cached_tokens']:>8} {w['computed_tokens']:>8} "
            f"{w['tokens_per_cycle'] or 0:>5.2f} | {r['ttft_s']:>8.3f} "
            f"{r['ttft_s'] / c['ttft_s']:>5.2f} {r['cached_tokens']:>8} "
            f"{r['tokens_per_cycle'] or 0:>5.2f} | "
            f"{w['computed_tokens'] / c['prompt_tokens']:>5.2f} "
            f"{1 - (w['cached_tokens'] / c['prompt_tokens']) ** 2:>5.2f}"
        )
    print(
        f"RSS MB: cold {results['cold_rss_mb']}, L1 {results['warm_l1_rss_mb']}, "
        f"after restart {results['restart_l2_rss_mb']}; L2 on disk {results.get('l2_disk_mb')} MB; "
        f"same transcript in all three runs: {results['same_transcript']}"
    )
    os.makedirs(args.out, exist_ok=True)
    # The default session keeps the file names of earlier runs; variants get a suffix.
    suffix = {"model_replies": "", "scripted": "_scripted"}.get(
        results["session"], "_no_user_turns"
    )
    shape = "" if args.shape == "small" else f"_{args.shape}"
    name = f"prefix_cache_ttft{shape}{suffix}.json"
    Path(args.out, name).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
