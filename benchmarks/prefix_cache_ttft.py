"""Prefix cache through the gateway: TTFT per turn of a growing agent session, cold vs warm (L1)
vs after a restart (L2), with prefill tokens restored vs computed.

Starts `toolflash serve` three times on loopback (no cache; cache with a disk tier; a restart
on the same disk tier), replays the same multi-turn session (a large system prompt with tool
definitions, then user turns, tool calls and tool results that grow the transcript to several
thousand tokens) with the `openai` SDK, streaming, and reads TTFT from the first content chunk.

    python benchmarks/prefix_cache_ttft.py --shape opencode --turns 10 --out benchmarks/results

Two session shapes: `small` starts at ~2.2k prompt tokens (a short system prompt and ten short
tool definitions); `opencode` starts where OpenCode's first main request does (~7.4k tokens:
a long system prompt and ten tools with long descriptions, see shared/design-notes.md). Both
add the same ~730 tokens per turn (an assistant tool call, a 40-function file as the tool
result, the next user message). A cache can at best skip what was seen before, so the
`floor` column (computed / prompt tokens) bounds the warm/cold ratio from below.
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
    system = SYSTEM + "\n\n" + "\n\n".join(
        f"Rule {i + 1}. {GUIDANCE[i % len(GUIDANCE)]}" for i in range(30)
    )
    tools = []
    for k, t in enumerate(TOOLS):
        fn = dict(t["function"])
        fn["description"] = fn["description"] + " " + " ".join(
            f"Note {j + 1}: {GUIDANCE[(j + k) % len(GUIDANCE)]}" for j in range(6)
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


def session_turns(n: int, system: str = SYSTEM) -> list[list[dict[str, Any]]]:
    """The message lists of each turn of one agent session (each extends the previous)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    turns = []
    for i in range(n):
        messages = messages + [
            {"role": "user", "content": f"Step {i}: open src/module_{i}.py and fix the bug."}
        ]
        turns.append(messages)
        call_id = f"call_{i}"
        result = "\n".join(f"def function_{i}_{j}(x):\n    return x + {j}" for j in range(40))
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
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ]
    return turns


def replay(
    base: str,
    turns: list[list[dict[str, Any]]],
    max_tokens: int,
    tools: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    rows = []
    for i, messages in enumerate(turns):
        t0 = time.perf_counter()
        ttft = None
        usage = None
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
            if ttft is None and chunk.choices:
                d = chunk.choices[0].delta
                if d.content or d.tool_calls or getattr(d, "reasoning_content", None):
                    ttft = time.perf_counter() - t0
            if chunk.usage:
                usage = chunk.usage
        assert usage is not None
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        rows.append(
            {
                "turn": i + 1,
                "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": cached,
                "computed_tokens": usage.prompt_tokens - (cached or 0),
                "ttft_s": round(ttft if ttft is not None else time.perf_counter() - t0, 4),
            }
        )
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
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--shape", choices=["small", "opencode"], default="opencode")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    system, tools = opencode_shape() if args.shape == "opencode" else (SYSTEM, TOOLS)
    turns = session_turns(args.turns, system)
    results: dict[str, Any] = {"shape": args.shape}
    with tempfile.TemporaryDirectory() as disk:
        for name, flags in [
            ("cold", ["--no-cache", "--policy", "off"]),
            ("warm_l1", ["--cache-dir", disk, "--policy", "off"]),
            ("restart_l2", ["--cache-dir", disk, "--policy", "off"]),
        ]:
            proc, base = start_server(flags)
            try:
                results[name] = replay(base, turns, args.max_tokens, tools)
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
    print(
        f"{'turn':>4} {'prompt':>6} | {'cold TTFT':>9} | {'L1 TTFT':>8} {'ratio':>5} {'restored':>8} | "
        f"{'L2 TTFT':>8} {'ratio':>5} {'restored':>8} | {'floor':>5}"
    )
    for c, w, r in zip(results["cold"], results["warm_l1"], results["restart_l2"], strict=True):
        print(
            f"{c['turn']:>4} {c['prompt_tokens']:>6} | {c['ttft_s']:>9.3f} | {w['ttft_s']:>8.3f} "
            f"{w['ttft_s'] / c['ttft_s']:>5.2f} {w['cached_tokens']:>8} | {r['ttft_s']:>8.3f} "
            f"{r['ttft_s'] / c['ttft_s']:>5.2f} {r['cached_tokens']:>8} | "
            f"{w['computed_tokens'] / c['prompt_tokens']:>5.2f}"
        )
    print(
        f"RSS MB: cold {results['cold_rss_mb']}, L1 {results['warm_l1_rss_mb']}, "
        f"after restart {results['restart_l2_rss_mb']}; L2 on disk {results.get('l2_disk_mb')} MB"
    )
    os.makedirs(args.out, exist_ok=True)
    name = "prefix_cache_ttft.json" if args.shape == "small" else f"prefix_cache_ttft_{args.shape}.json"
    Path(args.out, name).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
