"""One conformance table for every tool-call parser, complete and streaming, with split invariance."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

import pytest

from toolflash.gateway.chat_output import ChatOutput, MessageFold
from toolflash.gateway.tool_parsers import (
    PARSERS,
    CallArguments,
    CallClosed,
    CallHeader,
    Piece,
    SpanRejected,
    TextPiece,
    coalesce,
    get_parser,
)

TOOLS = {
    "read_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["path"],
    },
    "run": {
        "type": "object",
        "properties": {
            "cmd": {"type": "string"},
            "env": {"type": "object"},
            "dry": {"type": "boolean"},
            "args": {"type": "array"},
        },
    },
}


def hermes(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def xml(name: str, params: list[tuple[str, str]]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


@dataclass(frozen=True)
class Case:
    """Model text -> expected summary: ("text", s) | ("call", name, args_json|None, ok) |
    ("rejected", reason)."""

    id: str
    text: str
    expected: list[tuple[object, ...]]


LONG = 'line one\nline "two" with </param and <tags>\n\tä 🙂 \\ end'

HERMES_CASES = [
    Case("no_call", "Just text.\n\nMore text.", [("text", "Just text.\n\nMore text.")]),
    Case("lt_in_text", "a < b and <tool c", [("text", "a < b and <tool c")]),
    Case(
        "single",
        "Let me look.\n\n" + hermes("read_file", '{"path": "a.py", "limit": 3}'),
        [("text", "Let me look."), ("call", "read_file", '{"path": "a.py", "limit": 3}', True)],
    ),
    Case(
        "parallel",
        hermes("read_file", '{"path": "a"}')
        + "\n"
        + hermes("run", '{"cmd": "ls", "env": {"A": [1, {"b": "}"}]}}'),
        [
            ("call", "read_file", '{"path": "a"}', True),
            ("call", "run", '{"cmd": "ls", "env": {"A": [1, {"b": "}"}]}}', True),
        ],
    ),
    Case(
        "escapes",
        hermes("run", json.dumps({"cmd": LONG}, ensure_ascii=False)),
        [("call", "run", json.dumps({"cmd": LONG}, ensure_ascii=False), True)],
    ),
    Case(
        "text_after_call",
        hermes("read_file", '{"path": "a"}') + "\n\nDone.",
        [("call", "read_file", '{"path": "a"}', True), ("text", "Done.")],
    ),
    Case(
        "args_first_slow_path",
        '<tool_call>\n{"arguments": {"path": "x"}, "name": "read_file"}\n</tool_call>',
        [("call", "read_file", '{"path": "x"}', True)],
    ),
    Case(
        "args_as_string",
        '<tool_call>\n{"name": "read_file", "arguments": "{\\"path\\": \\"x\\"}"}\n</tool_call>',
        [("call", "read_file", '{"path": "x"}', True)],
    ),
    Case(
        "undeclared",
        "ok " + hermes("delete_all", '{"x": 1}'),
        [("text", "ok "), ("rejected", "undeclared_tool")],
    ),
    Case(
        "malformed_header",
        "<tool_call>\nnot json at all\n</tool_call> tail",
        [("rejected", "malformed"), ("text", " tail")],
    ),
    Case(
        "broken_args",
        '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls", <oops>}}\n</tool_call>',
        [("call", "run", None, False)],
    ),
    Case(
        "truncated_in_args",
        'x <tool_call>\n{"name": "run", "arguments": {"cmd": "l',
        [("text", "x"), ("call", "run", '{"cmd": "l', False)],
    ),
    Case("truncated_in_header", 'x <tool_call>\n{"na', [("text", "x "), ("rejected", "truncated")]),
    Case(
        "missing_end_tag",
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}}',
        [("call", "read_file", '{"path": "a"}', True)],
    ),
    Case("partial_start_at_end", "text <tool_ca", [("text", "text <tool_ca")]),
    Case("empty_arguments", hermes("run", "{}"), [("call", "run", "{}", True)]),
    Case(
        "compact_json",
        '<tool_call>{"name":"read_file","arguments":{"path":"a"}}</tool_call>',
        [("call", "read_file", '{"path":"a"}', True)],
    ),
]

XML_CASES = [
    Case("no_call", "Plain <b>html</b> text.", [("text", "Plain <b>html</b> text.")]),
    Case(
        "single",
        "Reading.\n" + xml("read_file", [("path", "src/a.py"), ("limit", "10")]),
        [("text", "Reading."), ("call", "read_file", '{"path": "src/a.py", "limit": 10}', True)],
    ),
    Case(
        "types",
        xml("run", [("cmd", LONG), ("env", '{"A": "1"}'), ("dry", "true"), ("args", "[1, 2]")]),
        [
            (
                "call",
                "run",
                json.dumps(
                    {"cmd": LONG, "env": {"A": "1"}, "dry": True, "args": [1, 2]},
                    ensure_ascii=False,
                ),
                True,
            )
        ],
    ),
    Case(
        "undeclared_param_is_string",
        xml("read_file", [("path", "a"), ("extra", "42")]),
        [("call", "read_file", '{"path": "a", "extra": "42"}', True)],
    ),
    Case(
        "parallel",
        xml("read_file", [("path", "a")]) + "\n" + xml("read_file", [("path", "b")]),
        [
            ("call", "read_file", '{"path": "a"}', True),
            ("call", "read_file", '{"path": "b"}', True),
        ],
    ),
    Case(
        "empty_value",
        xml("read_file", [("path", "")]),
        [("call", "read_file", '{"path": ""}', True)],
    ),
    Case("undeclared", xml("rm_rf", [("p", "/")]), [("rejected", "undeclared_tool")]),
    Case("no_parameters", xml("run", []), [("call", "run", "{}", True)]),
    Case(
        "inline_value",
        "<tool_call><function=read_file><parameter=path>a.py</parameter></function></tool_call>",
        [("call", "read_file", '{"path": "a.py"}', True)],
    ),
    Case(
        "multiline_value_keeps_inner_newlines",
        xml("run", [("cmd", "\nline1\n\nline2\n")]),
        [("call", "run", json.dumps({"cmd": "\nline1\n\nline2\n"}), True)],
    ),
    Case(
        "malformed_opening",
        "<tool_call>\n<funk>\n</tool_call>",
        [("rejected", "malformed")],
    ),
    Case(
        "broken_params",
        "<tool_call>\n<function=run>\ngarbage\n</function>\n</tool_call>",
        [("call", "run", None, False)],
    ),
    Case(
        "truncated_in_value",
        "<tool_call>\n<function=run>\n<parameter=cmd>\nls -l",
        [("call", "run", '{"cmd": "ls -l', False)],
    ),
    Case(
        "truncated_in_header",
        "ok <tool_call>\n<funct",
        [("text", "ok "), ("rejected", "truncated")],
    ),
]

CASES = {"hermes": HERMES_CASES, "qwen3_coder": XML_CASES}
ALL = [(fmt, c) for fmt, cases in CASES.items() for c in cases]


def summarize(pieces: list[Piece]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    args: dict[int, str] = {}
    for p in coalesce(pieces):
        if isinstance(p, TextPiece):
            out.append(("text", p.text))
        elif isinstance(p, SpanRejected):
            out.append(("rejected", p.reason))
        elif isinstance(p, CallHeader):
            args[p.index] = ""
        elif isinstance(p, CallArguments):
            args[p.index] += p.fragment
        elif isinstance(p, CallClosed):
            assert p.arguments == args[p.index], "close record disagrees with the fragments"
            out.append(("call", p.name, p.arguments, p.ok))
    return out


def as_text(pieces: list[Piece]) -> str:
    """Content text of a piece list (text and rejected spans), in order."""
    return "".join(
        p.text if isinstance(p, TextPiece) else p.raw
        for p in pieces
        if isinstance(p, TextPiece | SpanRejected)
    )


def stream_pieces(fmt: str, chunks: list[str]) -> list[Piece]:
    s = get_parser(fmt).stream(TOOLS)
    pieces: list[Piece] = []
    for c in chunks:
        pieces += s.feed(c)
    return pieces + s.close()


def random_batchings(text: str, n: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chunks, i = [], 0
        while i < len(text):
            k = rng.randint(1, 16)
            chunks.append(text[i : i + k])
            i += k
        out.append(chunks)
    return out


@pytest.mark.parametrize(("fmt", "case"), ALL, ids=[f"{f}-{c.id}" for f, c in ALL])
def test_complete_parse(fmt: str, case: Case) -> None:
    got = summarize(get_parser(fmt).parse(case.text, TOOLS))
    assert len(got) == len(case.expected), got
    for g, e in zip(got, case.expected, strict=True):
        if e[0] == "call" and e[2] is None:
            assert g[:2] == e[:2] and g[3] == e[3], got
        else:
            assert g == e, got
    # Without a call the model's text comes back exactly, rejected spans included.
    if not any(e[0] == "call" for e in case.expected):
        assert as_text(get_parser(fmt).parse(case.text, TOOLS)) == case.text


@pytest.mark.parametrize(("fmt", "case"), ALL, ids=[f"{f}-{c.id}" for f, c in ALL])
def test_streaming_split_invariance(fmt: str, case: Case) -> None:
    whole = coalesce(get_parser(fmt).parse(case.text, TOOLS))
    text = case.text
    batchings = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    batchings += random_batchings(text, 100, seed=len(text))
    batchings.append(list(text))
    failing = [b for b in batchings if coalesce(stream_pieces(fmt, b)) != whole]
    if failing:
        smallest = min(failing, key=len)
        pytest.fail(f"{len(failing)} batchings differ; smallest: {smallest!r}")


@pytest.mark.parametrize(("fmt", "case"), ALL, ids=[f"{f}-{c.id}" for f, c in ALL])
def test_a_failed_call_carries_its_span_text(fmt: str, case: Case) -> None:
    """A call that closes not ok carries its span's text (tags included) however the text came,
    so a caller that held it back returns it as text (forced calls, whole-call dialects)."""
    for chunks in ([case.text], list(case.text)):
        for p in stream_pieces(fmt, chunks):
            if isinstance(p, CallClosed):
                if p.ok:
                    assert p.raw == ""
                else:
                    assert p.raw.startswith("<tool_call>") and p.raw in case.text, p
                    tail = case.text[case.text.index(p.raw) + len(p.raw) :]
                    assert p.raw.endswith("</tool_call>") or not tail.strip(), p


def test_every_parser_has_cases() -> None:
    assert set(PARSERS) == set(CASES)


def counter_ids():  # type: ignore[no-untyped-def]
    c = itertools.count()
    return lambda: f"call_{next(c)}"


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_chat_output_reassembly_with_reasoning(fmt: str) -> None:
    """Reasoning + text + calls through ChatOutput: every chunking folds to the same message."""
    call = (
        hermes("read_file", '{"path": "a.py"}')
        if fmt == "hermes"
        else xml("read_file", [("path", "a.py")])
    )
    text = "Thinking about <tool_call> here.\n</think>\n\nI will call.\n" + call
    messages = []
    for chunks in (
        [[text]]
        + [[text[:i], text[i:]] for i in range(0, len(text) + 1, 3)]
        + random_batchings(text, 40)
    ):
        out = ChatOutput(
            parser=get_parser(fmt), tools=TOOLS, start_in_reasoning=True, id_factory=counter_ids()
        )
        fold = MessageFold()
        for c in chunks:
            fold.add(out.feed(c))
        fold.add(out.close())
        messages.append(fold.message())
        assert out.valid_calls == 1 and out.reports[0].schema_valid
    assert all(m == messages[0] for m in messages)
    m = messages[0]
    assert m["reasoning_content"] == "Thinking about <tool_call> here."
    assert m["content"] == "I will call."
    assert m["tool_calls"][0]["function"]["name"] == "read_file"


def test_parallel_false_stops_after_first_call() -> None:
    text = CASES["hermes"][3].text
    out = ChatOutput(
        parser=get_parser("hermes"),
        tools=TOOLS,
        start_in_reasoning=False,
        parallel_tool_calls=False,
    )
    fold = MessageFold()
    for ch in text:
        fold.add(out.feed(ch))
        if out.stop_requested:
            break
    assert out.stop_requested
    assert len(fold.message()["tool_calls"]) == 1


def test_schema_violation_is_reported_not_dropped() -> None:
    out = ChatOutput(parser=get_parser("hermes"), tools=TOOLS, start_in_reasoning=False)
    fold = MessageFold()
    fold.add(out.feed(hermes("read_file", '{"limit": "ten"}')))
    fold.add(out.close())
    assert len(fold.message()["tool_calls"]) == 1
    report = out.reports[0]
    assert report.parsed and report.schema_valid is False
    assert any("path" in e for e in report.schema_errors)
    assert any("limit" in e for e in report.schema_errors)


def test_no_tools_means_no_parsing() -> None:
    text = hermes("read_file", '{"path": "a"}')
    out = ChatOutput(parser=get_parser("hermes"), tools={}, start_in_reasoning=False)
    fold = MessageFold()
    fold.add(out.feed(text))
    fold.add(out.close())
    assert fold.message()["content"] == text and fold.message()["tool_calls"] is None
