"""Seeded synthetic coding-agent conversations with tool calls (single, parallel, sequential).

A dialogue offers a random subset of the tool catalog, asks for something, answers with
1-3 tool calls (optionally after `<think>` reasoning), gets `<tool_response>` results and ends
with a final answer that reuses the values it was given.
"""

from __future__ import annotations

import json
import random
from typing import Any

from toolflash.zoo import slots as s
from toolflash.zoo.records import Record, ToolCallFormat
from toolflash.zoo.tools_catalog import BY_NAME, CATALOG, Args, CatalogTool, Result

SYSTEM_PROMPTS = (
    "You are a helpful coding assistant working in the user's repository. Use the tools when they help.",
    "You are an autonomous software engineering agent. Prefer reading files before editing them.",
    "You are a concise assistant with access to tools. Call a tool when you need fresh information.",
    "You are ToolFlash, an AI assistant for developers. Answer briefly and use tools for facts.",
    "You help with everyday tasks: weather, calendar, email, math and code. Use the tools provided.",
)
PREAMBLES = (
    "", "", "I'll check that.", "Let me look that up.", "Sure, one moment.",
    "I'll use the {tool} tool for this.", "Let me call {tool}.", "Okay, running {tool} now.",
)  # fmt: skip
JOINERS = (" Also, ", " And ", " Then ", "\n")


def fmt_value(value: Any) -> str:
    """How a slot value reads inside prose: strings bare, string lists joined, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return json.dumps(value, ensure_ascii=False)


def _fill(template: str, args: Args, result: Result | None = None) -> str:
    values = {k: fmt_value(v) for k, v in args.items()}
    if result is not None:
        values.update({f"r_{k}": fmt_value(v) for k, v in result.items()})
    return template.format_map(_Blank(values))


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:  # optional args absent from this draw
        return "it"


def _call(spec: CatalogTool, args: Args) -> dict[str, Any]:
    return {"type": "function", "function": {"name": spec.name, "arguments": args}}


def _request(rng: random.Random, spec: CatalogTool, args: Args) -> str:
    return _fill(rng.choice(spec.requests), args)


def _reasoning(rng: random.Random, calls: list[tuple[CatalogTool, Args]]) -> str:
    parts = [
        rng.choice(
            (
                "Task: {what}. I should call {tool} with {args}.",
                "I need {tool} ({what}); the arguments are {args}.",
                "To answer I will use {tool}. Arguments: {args}.",
            )
        ).format(
            what=spec.description.rstrip(".").lower(),
            tool=spec.name,
            args=json.dumps(args, ensure_ascii=False),
        )
        for spec, args in calls
    ]
    if len(calls) > 1:
        parts.append("These calls are independent, so I can make them together.")
    return " ".join(parts)


def _final_reasoning(rng: random.Random, results: list[tuple[CatalogTool, Result]]) -> str:
    return " ".join(
        f"{spec.name} returned {json.dumps(result, ensure_ascii=False)[:300]}."
        for spec, result in results
    ) + rng.choice((" Now I can answer.", " I'll summarize this for the user.", ""))


def _assistant_calls(
    rng: random.Random, calls: list[tuple[CatalogTool, Args]], thinking: bool
) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": rng.choice(PREAMBLES).format(tool=calls[0][0].name),
        "tool_calls": [_call(spec, args) for spec, args in calls],
    }
    if thinking:
        msg["reasoning_content"] = _reasoning(rng, calls)
    return msg


def _tool_messages(results: list[tuple[CatalogTool, Result]]) -> list[dict[str, Any]]:
    return [
        {"role": "tool", "name": spec.name, "content": json.dumps(result, ensure_ascii=False)}
        for spec, result in results
    ]


def _final(
    rng: random.Random,
    done: list[tuple[CatalogTool, Args, Result]],
    thinking: bool,
) -> dict[str, Any]:
    text = " ".join(_fill(rng.choice(spec.answers), args, result) for spec, args, result in done)
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        msg["reasoning_content"] = _final_reasoning(rng, [(sp, r) for sp, _, r in done])
    return msg


def _tools_offered(rng: random.Random, used: list[CatalogTool]) -> list[dict[str, Any]]:
    names = {spec.name for spec in used}
    others = [t for t in CATALOG if t.name not in names]
    offered = list(used) + rng.sample(others, rng.randint(1, 6))
    rng.shuffle(offered)
    # The same tool may be used twice (two cities): list each tool once.
    seen: dict[str, CatalogTool] = {t.name: t for t in offered}
    return [t.schema() for t in seen.values()]


def _edit_from_snippet(rng: random.Random, path: str, snippet: str) -> Args:
    lines = [ln for ln in snippet.splitlines() if ln.strip() and len(ln) < 100]
    old = rng.choice(lines).strip() if lines else "pass"
    new = old.replace("return ", "return (", 1) + ")" if "return " in old else old + "  # checked"
    return {"path": path, "old_string": old, "new_string": new}


def dialogue(rng: random.Random, code: list[str], chats: list[tuple[str, str]]) -> Record:
    """One synthetic agent conversation drawn from `rng`.

    `code` holds stdlib snippets used as file contents; `chats` holds (user, assistant) pairs
    answered without tools even though tools are offered.
    """
    fmt: ToolCallFormat = "hermes" if rng.random() < 0.6 else "qwen3_coder"
    thinking = rng.random() < 0.4
    shape = rng.choices(
        ["single", "parallel", "sequential", "coding", "no_tool"], weights=[34, 20, 16, 18, 12]
    )[0]
    messages: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}]
    used: list[CatalogTool] = []

    if shape == "no_tool" and chats:
        user, answer = rng.choice(chats)
        messages += [{"role": "user", "content": user}]
        reply: dict[str, Any] = {"role": "assistant", "content": answer}
        if thinking:
            reply["reasoning_content"] = "No tool is needed; I can answer this directly."
        messages.append(reply)
        used = [rng.choice(CATALOG)]
    elif shape == "coding":
        read, edit = BY_NAME["read_file"], BY_NAME["edit_file"]
        path = s.path(rng, ".py")
        snippet = rng.choice(code) if code else "def main():\n    return 0\n"
        messages.append({"role": "user", "content": rng.choice((
            f"There is a bug in {path}. Take a look and fix the return value.",
            f"Please review {path} and make the smallest safe fix.",
            f"Open {path}, find the issue and patch it.",
        ))})  # fmt: skip
        read_args: Args = {"path": path}
        messages.append(_assistant_calls(rng, [(read, read_args)], thinking))
        messages += _tool_messages([(read, {"path": path, "content": snippet})])
        edit_args = _edit_from_snippet(rng, path, snippet)
        messages.append(_assistant_calls(rng, [(edit, edit_args)], thinking))
        edit_result: Result = {"ok": True, "replacements": 1}
        messages += _tool_messages([(edit, edit_result)])
        used = [read, edit]
        done = [(edit, edit_args, edit_result)]
        if rng.random() < 0.5:
            tests = BY_NAME["run_tests"]
            t_args: Args = {"path": "tests/test_" + path.rsplit("/", 1)[-1]}
            t_res = tests.make_result(rng, t_args, code)
            messages.append(_assistant_calls(rng, [(tests, t_args)], thinking))
            messages += _tool_messages([(tests, t_res)])
            used.append(tests)
            done.append((tests, t_args, t_res))
        messages.append(_final(rng, done, thinking))
    else:
        n = 1 if shape == "single" else rng.randint(2, 3)
        picks = [rng.choice(CATALOG) for _ in range(n)]
        if shape == "parallel" and rng.random() < 0.35:
            picks = [picks[0]] * n  # the same tool on different arguments, e.g. two cities
        calls = [(spec, spec.make_args(rng, code)) for spec in picks]
        results = [spec.make_result(rng, args, code) for spec, args in calls]
        request = rng.choice(JOINERS).join(_request(rng, spec, args) for spec, args in calls)
        messages.append({"role": "user", "content": request})
        if shape == "sequential":
            for (spec, args), result in zip(calls, results, strict=True):
                messages.append(_assistant_calls(rng, [(spec, args)], thinking))
                messages += _tool_messages([(spec, result)])
        else:
            messages.append(_assistant_calls(rng, calls, thinking))
            messages += _tool_messages(
                [(spec, r) for (spec, _), r in zip(calls, results, strict=True)]
            )
        messages.append(
            _final(rng, [(sp, a, r) for (sp, a), r in zip(calls, results, strict=True)], thinking)
        )
        used = picks

    return Record(
        kind="tool_chat",
        messages=messages,
        tools=_tools_offered(rng, used),
        enable_thinking=thinking,
        tool_call_format=fmt,
    )
