"""What an OpenAI request asks for, as a small frozen value the policy and the metrics key on.

The classifier is explicit on purpose: a handful of request features, each with a fixed set of
values, so the `label` (used as a Prometheus label) has bounded cardinality.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# Constrained decoding (grammar masks) changes what the drafter can get accepted, so every
# constrained request has its own kind: "json" (response_format), "tool-forced" (tool_choice
# required or named) and "tools-strict" (tool_choice auto with a `strict` tool).
Kind = Literal["chat", "tools", "tools-strict", "tool-forced", "json"]
Thinking = Literal["on", "off", "default"]
LengthBand = Literal["lt1k", "lt4k", "lt16k", "ge16k"]

# Upper bounds (exclusive) of the prompt-length bands, in tokens.
LENGTH_BANDS: tuple[tuple[int, LengthBand], ...] = (
    (1024, "lt1k"),
    (4096, "lt4k"),
    (16384, "lt16k"),
)


@dataclass(frozen=True)
class RequestClass:
    """The request class: kind of output asked for, sampled or greedy, thinking, turn position,
    prompt length band.

    `sampled` (temperature > 0 after the model's defaults) is its own class: the drafter's
    guesses match a draw from the target far less often than its argmax, so sampled requests
    get far fewer tokens per cycle and the policy must not average them with greedy ones."""

    kind: Kind
    thinking: Thinking
    after_tool_result: bool
    length_band: LengthBand
    sampled: bool = False

    @property
    def label(self) -> str:
        """Stable short name, e.g. `tools.think-off.tool-result.lt4k` (greedy) or
        `tools.sampled.think-off.tool-result.lt4k` (sampled)."""
        turn = "tool-result" if self.after_tool_result else "user"
        kind = f"{self.kind}.sampled" if self.sampled else self.kind
        return f"{kind}.think-{self.thinking}.{turn}.{self.length_band}"


def label_scheme() -> str:
    """How class labels are built, with every value each part takes (for docs and
    `toolflash policy show`)."""
    kinds = "|".join(get_args(Kind))
    thinking = "|".join(get_args(Thinking))
    bands = "|".join(get_args(LengthBand))
    return f"{{{kinds}}}[.sampled].think-{{{thinking}}}.{{user|tool-result}}.{{{bands}}}"


def length_band(prompt_tokens: int) -> LengthBand:
    """The band a prompt of this many tokens falls in."""
    for bound, band in LENGTH_BANDS:
        if prompt_tokens < bound:
            return band
    return "ge16k"


def classify(
    *,
    tools_offered: bool,
    tool_choice: str,
    response_format: str | None,
    enable_thinking: bool | None,
    last_role: str | None,
    prompt_tokens: int,
    strict_tools: bool = False,
    sampled: bool = False,
) -> RequestClass:
    """Classify a parsed request.

    `tool_choice` is "auto", "none", "required" or "named"; `response_format` is the OpenAI type
    ("text", "json_object", "json_schema") or None; `enable_thinking` is the chat-template switch
    (None when the client left the template default); `last_role` is the role of the last message;
    `strict_tools` says whether an offered tool is `strict` (its arguments are constrained);
    `sampled` whether the effective sampling (request, else the model's defaults) has
    temperature > 0.
    A structured response format wins over tools, a forced tool over offered tools.
    """
    kind: Kind
    if response_format in ("json_object", "json_schema"):
        kind = "json"
    elif tools_offered and tool_choice in ("required", "named"):
        kind = "tool-forced"
    elif tools_offered and tool_choice != "none":
        kind = "tools-strict" if strict_tools else "tools"
    else:
        kind = "chat"
    thinking: Thinking = (
        "default" if enable_thinking is None else ("on" if enable_thinking else "off")
    )
    return RequestClass(
        kind=kind,
        thinking=thinking,
        after_tool_result=last_role == "tool",
        length_band=length_band(prompt_tokens),
        sampled=sampled,
    )
