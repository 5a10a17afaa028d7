"""The corpus record type and the prompt type extracted from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

RecordKind = Literal["code_raw", "code_chat", "doc_chat", "tool_chat", "json_doc", "json_chat"]
PromptKind = Literal["free_text", "code", "tool_call", "json"]
ToolCallFormat = Literal["hermes", "qwen3_coder"]


@dataclass(frozen=True)
class Record:
    """One training sample: raw text (`text`) or a chat (`messages`, optional `tools`).

    `messages` use the OpenAI shape the chat template reads: `role`, `content`, optional
    `reasoning_content` and `tool_calls` (`{"type": "function", "function": {"name", "arguments"}}`).
    """

    kind: RecordKind
    text: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    enable_thinking: bool = False
    tool_call_format: ToolCallFormat = "hermes"

    @property
    def is_chat(self) -> bool:
        return self.text is None

    def chat_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `tokenizer.apply_chat_template` matching how this chat was made."""
        kwargs: dict[str, Any] = {"enable_thinking": self.enable_thinking}
        if self.tools:
            kwargs["tools"] = self.tools
            kwargs["tool_call_format"] = self.tool_call_format
        return kwargs


@dataclass(frozen=True)
class Prompt:
    """A conversation prefix ending where an assistant turn starts, plus its reference answer."""

    kind: PromptKind
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    enable_thinking: bool = False
    tool_call_format: ToolCallFormat = "hermes"
    reference: dict[str, Any] | None = None  # the assistant message the corpus had next

    def chat_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"enable_thinking": self.enable_thinking}
        if self.tools:
            kwargs["tools"] = self.tools
            kwargs["tool_call_format"] = self.tool_call_format
        return kwargs

    def render(self, tokenizer: Any) -> str:
        """The prompt text with the generation prompt appended (what a server would feed)."""
        return str(
            tokenizer.apply_chat_template(
                self.messages, tokenize=False, add_generation_prompt=True, **self.chat_kwargs()
            )
        )
