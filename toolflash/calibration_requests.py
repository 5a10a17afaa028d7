"""The requests calibration runs: built-in chat requests per request class, and long prompts.

They are OpenAI chat bodies, rendered later by the gateway's own path, so each lands in the class
a client's request of that shape would. The prompts are the held-out ones shipped with the
embedded models (`bench_prompts.jsonl`), none of them used in training.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

PROMPTS_FILE = "bench_prompts.jsonl"


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


def _bench_rows() -> list[dict[str, Any]]:
    from toolflash.engine.factory import assets_dir

    path = assets_dir() / PROMPTS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def class_bodies(per_kind: int, thinking_default: bool) -> list[tuple[str, dict[str, Any]]]:
    """(kind, chat request body) for each class calibration measures: free chat (prose and
    code), tools offered (`auto`) after a user turn and after a tool result, a forced call
    (`required`), a JSON-schema answer; each as the prompt comes and, where it sets thinking,
    also with the template's default."""
    rows = _bench_rows()

    def first(kind: str, n: int) -> list[dict[str, Any]]:
        return [r for r in rows if r["kind"] == kind][:n]

    n = per_kind
    code = first("code", n)
    picks = [("chat", r) for r in first("free_text", n - n // 2) + code[: n // 2]]
    kinds = ("tools", "tool-result", "tool-forced")
    picks += [(k, r) for r in first("tool_call", n) for k in kinds]
    picks += [("json", r) for r in first("json", n)]
    out: list[tuple[str, dict[str, Any]]] = []
    for i, (kind, r) in enumerate(picks):
        body: dict[str, Any] = {"messages": r["messages"]}
        if kind in kinds:
            body["tools"] = r["tools"]
        if kind == "tool-result":
            result = code[i % len(code)]["messages"][-1]["content"] if code else "ok"
            body["messages"] = r["messages"] + _tool_turn(r["tools"][0]["function"], result)
        if kind == "tool-forced":
            body["tool_choice"] = "required"
        if kind == "json":
            body["response_format"] = _json_format(r)
        kwargs = r.get("chat_template_kwargs") or {}
        out.append((kind, {**body, "chat_template_kwargs": kwargs}))
        if thinking_default and "enable_thinking" in kwargs:
            default = {k: v for k, v in kwargs.items() if k != "enable_thinking"}
            out.append((kind, {**body, "chat_template_kwargs": default}))
    return out


def _tool_turn(function: Mapping[str, Any], result: str) -> list[dict[str, Any]]:
    """An assistant turn calling `function` (its required arguments filled in by type) and
    the tool's result: the shape of an agent's turn after it read a file."""
    params = function.get("parameters") or {}
    props = params.get("properties") or {}
    fill = {"string": "README.md", "integer": 1, "number": 1, "boolean": True, "array": []}
    args = {p: fill.get(props.get(p, {}).get("type"), {}) for p in params.get("required", [])}
    call = {"name": function["name"], "arguments": json.dumps(args)}
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_0", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": result},
    ]


def _json_format(row: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema the prompt asks for (its system message states it), as a strict
    `response_format`; `json_object` when it states none."""
    system = " ".join(m["content"] for m in row["messages"] if m["role"] == "system")
    _, sep, tail = system.partition("schema:")
    if sep:
        try:
            schema = json.loads(tail.strip())
        except ValueError:
            schema = None
        if isinstance(schema, dict):
            spec = {"name": "answer", "schema": schema, "strict": True}
            return {"type": "json_schema", "json_schema": spec}
    return {"type": "json_object"}


def long_body(engine: _Encoder, tokens: int) -> dict[str, Any]:
    """A plain chat request of about `tokens` prompt tokens (code and prose to summarize)."""
    texts = [m["content"] for r in _bench_rows() for m in r["messages"] if m["role"] == "user"]
    corpus = "\n\n".join(texts)
    have = len(engine.encode(corpus))
    while have < tokens:  # the shipped prompts hold ~10k tokens; repeat for longer contexts
        corpus += "\n\n" + corpus
        have *= 2
    text = corpus[: int(len(corpus) * 0.97 * tokens / have)]
    content = f"{text}\n\nSummarize the code and notes above."
    return {"messages": [{"role": "user", "content": content}], "chat_template_kwargs": {}}
