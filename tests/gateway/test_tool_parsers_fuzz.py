"""Property test: on any mix of markup fragments the parsers never raise, are invariant to how
the text is chunked, and every emitted call closes with arguments equal to its fragments."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.gateway.test_tool_parsers import TOOLS, as_text, stream_pieces, summarize  # noqa: E402
from toolflash.gateway.chat_output import ChatOutput, MessageFold  # noqa: E402
from toolflash.gateway.tool_parsers import PARSERS, CallHeader, coalesce, get_parser  # noqa: E402

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<function=read_file>",
    "<function=nope>",
    "</function>",
    "<parameter=path>",
    "<parameter=limit>",
    "</parameter>",
    '{"name": "read_file", "arguments": ',
    '{"name": "run", "arguments": {',
    "{",
    "}",
    '"path"',
    ": ",
    ", ",
    '"a.py"',
    "12",
    "\n",
    " ",
    "<",
    "x",
    "\\",
    '"',
    "[",
    "]",
    "<think>",
    "</think>",
    "<tool_ca",
]

texts = st.lists(st.sampled_from(FRAGMENTS), max_size=25).map("".join)


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(text=texts, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_parsers_total_and_split_invariant(text: str, cuts: list[int]) -> None:
    for fmt in PARSERS:
        whole = coalesce(get_parser(fmt).parse(text, TOOLS))
        summarize(whole)  # checks every close record against its fragments
        assert coalesce(stream_pieces(fmt, chunked(text, cuts))) == whole
        if not any(isinstance(p, CallHeader) for p in whole):
            assert as_text(whole) == text  # no call: the text comes back exactly


@settings(
    max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    text=texts,
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
    think=st.booleans(),
)
def test_chat_output_split_invariant(text: str, cuts: list[int], think: bool) -> None:
    for fmt in PARSERS:
        folds = []
        for chunks in ([text], chunked(text, cuts)):
            ids = itertools.count()
            out = ChatOutput(
                parser=get_parser(fmt),
                tools=TOOLS,
                start_in_reasoning=think,
                id_factory=lambda ids=ids: f"call_{next(ids)}",
            )
            fold = MessageFold()
            for c in chunks:
                fold.add(out.feed(c))
            fold.add(out.close())
            folds.append(fold.message())
        assert folds[0] == folds[1]
