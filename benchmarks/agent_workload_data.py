"""The agent workload's data: multi-turn sessions read from `benchmarks/data/agent_workload/`,
turned into the chat completions bodies an agent would send (pure: no engine, no gateway).

`tools.json` maps a tool-set name to OpenAI `tools` entries. Each line of a `*.jsonl` file is a
session: `name`, `system`, `tools` (a tool-set name, or null for none), `tool_choice`,
`thinking` (the template's `enable_thinking`: true, false, or null to leave it unset), an
optional `response_format` (OpenAI's object) and `messages` (user, assistant, tool; an
assistant's tool-call `arguments` are written as objects for readability and sent as JSON
strings, as on the wire). Every assistant message is a point where the model generates: the
request's messages are the system prompt and everything before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data" / "agent_workload"
TOOLS_FILE = "tools.json"


class WorkloadDataError(ValueError):
    """A data file that cannot be used: names the file, the line and the reason."""


@dataclass(frozen=True)
class Session:
    """One conversation; `messages` holds the reference turns (the history of later turns)."""

    name: str
    system: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"
    thinking: bool | None = False
    response_format: Mapping[str, Any] | None = None

    @property
    def turns(self) -> list[int]:
        """Indexes of the assistant messages: the points where the model generates."""
        return [i for i, m in enumerate(self.messages) if m.get("role") == "assistant"]


@dataclass(frozen=True)
class Turn:
    """One request of the workload: a session's assistant turn as a chat completions body."""

    session: str
    turn: int  # index of the assistant message in the session's messages
    body: dict[str, Any]


def load_sessions(data_dir: Path = DATA_DIR, names: Sequence[str] = ()) -> list[Session]:
    """Every session of every `*.jsonl` file in `data_dir` (by file name, then line), or only
    those named in `names` (an unknown name is an error)."""
    tool_sets = _read_tools(data_dir / TOOLS_FILE)
    sessions: list[Session] = []
    for path in sorted(data_dir.glob("*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                sessions.append(_session(json.loads(line), tool_sets, f"{path.name}:{n}"))
    seen = [s.name for s in sessions]
    if len(set(seen)) != len(seen):
        raise WorkloadDataError(f"{data_dir}: session names repeat")
    if names:
        unknown = sorted(set(names) - set(seen))
        if unknown:
            raise WorkloadDataError(f"no session named {', '.join(unknown)} in {data_dir}")
        sessions = [s for s in sessions if s.name in names]
    return sessions


def _read_tools(path: Path) -> dict[str, list[dict[str, Any]]]:
    sets = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(sets, dict) or not all(isinstance(v, list) for v in sets.values()):
        raise WorkloadDataError(f"{path}: must map tool-set names to lists of tools")
    return sets


def _session(row: Mapping[str, Any], tool_sets: Mapping[str, Any], where: str) -> Session:
    try:
        tools = row.get("tools")
        if tools is not None and tools not in tool_sets:
            raise WorkloadDataError(f"{where}: unknown tool set {tools!r}")
        messages = tuple(row["messages"])
        session = Session(
            name=row["name"],
            system=row["system"],
            messages=messages,
            tools=tuple(tool_sets[tools]) if tools is not None else (),
            tool_choice=row.get("tool_choice", "auto"),
            thinking=row.get("thinking", False),
            response_format=row.get("response_format"),
        )
    except KeyError as exc:
        raise WorkloadDataError(f"{where}: missing field {exc}") from None
    if not session.turns:
        raise WorkloadDataError(f"{where}: session {session.name!r} has no assistant turn")
    return session


def wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as a client sends it: tool-call arguments as JSON strings."""
    out = dict(message)
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {
                **call,
                "function": {
                    **call["function"],
                    "arguments": _arguments(call["function"]["arguments"]),
                },
            }
            for call in out["tool_calls"]
        ]
    return out


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def turn_bodies(session: Session, model: str, max_tokens: int) -> Iterator[Turn]:
    """The chat completions body of each assistant turn: greedy (`temperature` 0, so every
    strategy's output must be the same), at most `max_tokens`."""
    history: list[dict[str, Any]] = [{"role": "system", "content": session.system}]
    for i, message in enumerate(session.messages):
        if message.get("role") == "assistant":
            body: dict[str, Any] = {
                "model": model,
                "messages": list(history),
                "max_tokens": max_tokens,
                "temperature": 0.0,
            }
            if session.tools:
                body["tools"] = [dict(t) for t in session.tools]
                body["tool_choice"] = session.tool_choice
            if session.response_format is not None:
                body["response_format"] = dict(session.response_format)
            if session.thinking is not None:
                body["chat_template_kwargs"] = {"enable_thinking": session.thinking}
            yield Turn(session.name, i, body)
        history.append(wire_message(message))
