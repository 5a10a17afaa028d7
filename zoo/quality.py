"""Quick quality checks on a target's samples: do its tool calls and JSON answers parse?"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from toolflash.zoo.records import ToolCallFormat

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FENCE = re.compile(r"```(?:json)?\n(.*?)\n```", re.S)


@dataclass(frozen=True)
class ToolCallCheck:
    """Tool-call blocks found in a sample, how many parsed, and whether each names an offered tool."""

    blocks: int
    parsed: list[dict[str, Any]]
    known_names: bool

    @property
    def well_formed(self) -> bool:
        return self.blocks > 0 and len(self.parsed) == self.blocks and self.known_names


def check_tool_calls(
    text: str, fmt: ToolCallFormat, tools: list[dict[str, Any]] | None
) -> ToolCallCheck:
    """Parse every `<tool_call>` block of `text` with mlx-lm's parser for `fmt`."""
    from mlx_lm.tool_parsers import json_tools, qwen3_coder

    parser = qwen3_coder if fmt == "qwen3_coder" else json_tools
    blocks = _BLOCK.findall(text)
    parsed: list[dict[str, Any]] = []
    opened = text.count("<tool_call>")  # an unterminated call counts as a failed one
    for block in blocks:
        try:
            call = parser.parse_tool_call(block, tools)
        except (ValueError, json.JSONDecodeError):
            continue
        if isinstance(call, dict) and "name" in call:
            parsed.append(call)
    names = {t["function"]["name"] for t in tools or []}
    return ToolCallCheck(opened, parsed, all(c["name"] in names for c in parsed))


def parses_as_json(text: str) -> bool:
    """True when the answer (after any think block, inside any ```json fence) is a JSON value."""
    body = text.split("</think>")[-1].strip()
    fenced = _FENCE.search(body)
    try:
        json.loads(fenced.group(1) if fenced else body)
    except json.JSONDecodeError:
        return False
    return True
