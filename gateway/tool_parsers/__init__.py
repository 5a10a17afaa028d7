"""Tool-call parsers, one module per format, picked by name from `PARSERS`."""

from __future__ import annotations

from toolflash.gateway.tool_parsers.base import (
    CallArguments,
    CallClosed,
    CallHeader,
    Piece,
    SpanRejected,
    TextPiece,
    ToolCallStream,
    ToolParser,
    ToolSchemas,
    coalesce,
)
from toolflash.gateway.tool_parsers.hermes import HermesParser
from toolflash.gateway.tool_parsers.qwen3_coder import Qwen3CoderParser

PARSERS: dict[str, ToolParser] = {
    HermesParser.name: HermesParser(),
    Qwen3CoderParser.name: Qwen3CoderParser(),
}


def get_parser(name: str) -> ToolParser:
    """The parser for a tool-call format name (the engine's `tool_call_format`)."""
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; known: {sorted(PARSERS)}") from None


__all__ = [
    "PARSERS",
    "CallArguments",
    "CallClosed",
    "CallHeader",
    "Piece",
    "SpanRejected",
    "TextPiece",
    "ToolCallStream",
    "ToolParser",
    "ToolSchemas",
    "coalesce",
    "get_parser",
]
