"""Anthropic Messages API wire types (pydantic). Never imports mlx.

Requests allow extra fields (clients send more than we read: `cache_control`, `citations`,
`service_tier`, ...) and `ignored_fields` names them for the log. Content block and tool types
that would change what the model sees but are not implemented (images, documents, server
tools) are refused with a 400 naming them, never dropped silently.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolflash.gateway.protocol import (
    OpenAIBaseModel,
    StopString,
    ToolflashInfo,
    checked_json_schema,
)


class WireModel(OpenAIBaseModel):
    """Base for Anthropic request models: extras allowed and reported by `ignored_fields`."""


# ---------------------------------------------------------------- content blocks


class TextBlock(WireModel):
    type: Literal["text"]
    text: str


class ToolUseBlock(WireModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(WireModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None


class ThinkingBlock(WireModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(WireModel):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]
_BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
_ROLE_BLOCKS = {
    "system": {"text"},
    "user": {"text", "tool_result"},
    "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
}


def _check_block_types(content: Any, allowed: set[str] | None = None) -> None:
    """A clear 400 for a block type we do not implement (image, document, server tool
    results), or one the role cannot carry, before the union's own error."""
    if not isinstance(content, list):
        return
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind not in _BLOCK_TYPES:
            raise ValueError(
                f"content block type '{kind}' is not supported (supported: "
                f"{', '.join(_BLOCK_TYPES)})"
            )
        if allowed is not None and isinstance(kind, str) and kind not in allowed:
            raise ValueError(f"a '{kind}' block cannot appear in this message's role")


class MessageParam(WireModel):
    """A turn; `system` turns are mid-conversation instructions (Claude Code sends them, beta
    `mid-conversation-system`): text only, rendered as system messages where they stand."""

    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @model_validator(mode="before")
    @classmethod
    def _blocks(cls, data: Any) -> Any:
        if isinstance(data, dict):
            role = data.get("role")
            _check_block_types(data.get("content"), _ROLE_BLOCKS.get(str(role)))
        return data


# ---------------------------------------------------------------- tools and options


class ToolDef(WireModel):
    """A client tool (`type` absent or "custom"); server tools are refused."""

    name: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None
    strict: bool | None = None

    @field_validator("type")
    @classmethod
    def _custom_only(cls, kind: str | None) -> str | None:
        if kind not in (None, "custom"):
            raise ValueError(
                f"tool type '{kind}' (a server tool) is not supported; declare client tools "
                "with a name and an input_schema"
            )
        return kind

    @field_validator("input_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if schema.get("type") != "object":
            raise ValueError("input_schema must be a JSON schema of type 'object'")
        return checked_json_schema(schema)


class ToolChoiceParam(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoiceParam:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type 'tool' needs the tool's name")
        return self


class ThinkingParam(WireModel):
    """enabled (with a budget) and adaptive turn the model's thinking on, disabled off."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1024)


class Metadata(WireModel):
    user_id: str | None = Field(default=None, max_length=256)


class OutputFormat(WireModel):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(WireModel):
    format: OutputFormat | None = None


# ---------------------------------------------------------------- requests


class CountTokensRequest(WireModel):
    """POST /v1/messages/count_tokens: the prompt part of a Messages request."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None

    @model_validator(mode="after")
    def _check_tools(self) -> CountTokensRequest:
        names = [t.name for t in self.tools or []]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(dupes)}")
        choice = self.tool_choice
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names '{choice.name}', which is not in tools")
        if self.thinking is not None and self.thinking.type == "enabled":
            if self.thinking.budget_tokens is None:
                raise ValueError("thinking of type 'enabled' needs budget_tokens (>= 1024)")
        return self


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    metadata: Metadata | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=16)] | None = None
    stream: bool | None = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _budget(self) -> MessagesRequest:
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and budget >= self.max_tokens:
            raise ValueError(
                f"thinking.budget_tokens ({budget}) must be less than max_tokens "
                f"({self.max_tokens})"
            )
        return self


# ---------------------------------------------------------------- responses


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    # Anthropic signs thinking so it can be replayed; there is nothing to sign here.
    signature: str = ""


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentOut = TextOut | ThinkingOut | ToolUseOut
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicUsage(BaseModel):
    """`input_tokens` excludes the prompt tokens read from the prefix cache
    (`cache_read_input_tokens`), as Anthropic counts them."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentOut]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: AnthropicUsage
    toolflash: ToolflashInfo | None = None


class CountTokensResponse(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    model_config = ConfigDict(title="AnthropicErrorResponse")

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
