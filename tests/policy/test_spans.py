"""Span-kind detection: tables, marker splits, and invariance under any chunking."""

from __future__ import annotations

import random

import pytest

from toolflash.policy.spans import SpanTracker, partial_suffix

HERMES = (
    'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
)
CODER = (
    "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n</function>\n</tool_call>"
    "\nDone."
)
THINK = "<think>\nthe user wants a file\n</think>\n\nSure: <tool_call>{}</tool_call>"
JSON_BODY = '  {"a": [1, {"b": "}]"}], "c": "\\"{"}\nThat is all.'


def kinds_by_char(text: str, **kw: bool) -> list[str]:
    tracker = SpanTracker(**kw)
    return [tracker.push(c) for c in text]


@pytest.mark.parametrize(
    ("text", "probes"),
    [
        (HERMES, {"Let me": "text", "read_file": "tool_call", "a.py": "tool_call"}),
        (CODER, {"<function=run": "tool_call", "ls -la": "tool_call", "Done": "text"}),
        (THINK, {"the user": "reasoning", "Sure": "text", "{}": "tool_call"}),
        (JSON_BODY, {'"b"': "json", '"c"': "json", "That is": "text"}),
        ("Use <think> tags like </think> in prose", {"tags": "text", "prose": "text"}),
        ("x = {1: 2}", {"1: 2": "text"}),
    ],
)
def test_kind_at_positions(text: str, probes: dict[str, str]) -> None:
    kinds = kinds_by_char(text)
    for needle, kind in probes.items():
        at = text.index(needle) + len(needle) - 1
        assert kinds[at] == kind, (needle, kinds[at])


def test_tool_call_ends_after_close_marker() -> None:
    tracker = SpanTracker()
    assert tracker.push("<tool_") == "text"  # could still be a marker: held back
    assert tracker.push('call>{"name"') == "tool_call"
    assert tracker.push(": 1}</tool") == "tool_call"
    assert tracker.push("_call>") == "text"
    assert tracker.transitions == 2


def test_json_response_format_is_json_throughout() -> None:
    tracker = SpanTracker(json_output=True)
    assert tracker.push('{"answer": ') == "json"
    assert tracker.push("42}") == "json"
    assert tracker.push("\n") == "json"


def test_start_in_reasoning_and_json_after_thought() -> None:
    tracker = SpanTracker(start_in_reasoning=True)
    assert tracker.kind == "reasoning"
    assert tracker.push("hmm </thi") == "reasoning"
    assert tracker.push("nk>\n\n") == "text"
    assert tracker.push('[1, "]"') == "json"
    assert tracker.push(", 2]") == "text"


def test_partial_suffix() -> None:
    assert partial_suffix("abc <tool", ("<tool_call>",)) == 5
    assert partial_suffix("abc", ("<tool_call>",)) == 0
    assert partial_suffix("<tool_call>", ("<tool_call>",)) == 0  # a whole marker is not partial


@pytest.mark.parametrize("text", [HERMES, CODER, THINK, JSON_BODY, HERMES + "\n" + CODER])
def test_any_chunking_gives_the_same_kinds(text: str) -> None:
    reference = kinds_by_char(text)
    rng = random.Random(0)
    for _ in range(50):
        tracker = SpanTracker()
        pos = 0
        while pos < len(text):
            n = rng.randint(1, 16)  # what one spec cycle may commit
            kind = tracker.push(text[pos : pos + n])
            pos = min(pos + n, len(text))
            assert kind == reference[pos - 1], (pos, text[:pos])
