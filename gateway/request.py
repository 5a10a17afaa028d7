"""The dialect-neutral request: what every API route's request becomes before any work is queued.

Each API dialect (chat completions, text completions, Anthropic Messages, OpenAI Responses)
parses its own wire body and turns it into an `ApiRequest`; from there one request path renders,
tokenizes, classifies, constrains and generates it (`gateway/prepare.py`), and one reader turns
the engine's events into dialect-neutral output pieces (`gateway/reader.py`). No pydantic, no
starlette, no mlx here: plain frozen values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ToolChoiceKind = Literal["auto", "none", "required", "named"]


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its JSON-schema `parameters` (None: any object), whether
    they are enforced (`strict`), and the tool as the chat template receives it (OpenAI's
    `{"type": "function", "function": {...}}` shape, what HF templates read)."""

    name: str
    parameters: Mapping[str, Any] | None
    strict: bool
    template: Mapping[str, Any]


@dataclass(frozen=True)
class ToolChoice:
    """auto (the model decides), none (no tools rendered), required (one call at least), or
    named (that tool, once)."""

    kind: ToolChoiceKind = "auto"
    name: str | None = None


@dataclass(frozen=True)
class JsonFormat:
    """A JSON answer: any object (`schema` None) or one valid against `schema`; `param` names
    the schema's place in the dialect's body (for the 400 when it cannot be enforced)."""

    schema: Mapping[str, Any] | None = None
    strict: bool = False
    param: str = "response_format"
    # The dialect's own name for the format (the request class reads it): json_object or
    # json_schema.
    kind: Literal["json_object", "json_schema"] = "json_object"


@dataclass(frozen=True)
class Conversation:
    """A chat-template prompt: messages in the template's shape (roles system / user /
    assistant / tool; assistant tool-call arguments as objects), the tools offered, how the
    model may use them, an optional JSON answer and the template switches."""

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    json_format: JsonFormat | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    # Characters every chat template renders verbatim (system, user and tool text): a
    # conversation whose text cannot fit the context is refused before rendering.
    verbatim_chars: int = 0

    @property
    def offered_tools(self) -> list[dict[str, Any]] | None:
        """Tools to render, or None (no tools, or tool_choice none)."""
        if not self.tools or self.tool_choice.kind == "none":
            return None
        return [dict(t.template) for t in self.tools]

    @property
    def last_role(self) -> str | None:
        return str(self.messages[-1].get("role")) if self.messages else None

    @property
    def enable_thinking(self) -> bool | None:
        value = self.template_kwargs.get("enable_thinking")
        return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class TextPrompt:
    """A raw prompt (no template, no tool or reasoning parsing): text or token ids."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SamplingFields:
    """The sampling fields a request set (None: left out; the model's defaults or greedy fill
    them, `gateway/sampling.py`). `logit_bias` maps token-id strings to a bias."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: Mapping[str, float] | None = None


@dataclass(frozen=True)
class ApiRequest:
    """One request of any dialect. `max_tokens` None: the remaining context, capped at the
    server's default; `logprobs` None: off, n: the n most likely alternatives per token."""

    prompt: Conversation | TextPrompt
    max_tokens: int | None = None
    sampling: SamplingFields = SamplingFields()
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    # Tool calls go out only once they parsed whole (dialects whose tool-call blocks carry a
    # parsed object, not a string of arguments): a call cut short comes back as text.
    whole_tool_calls: bool = False
    # Opt-in sparse prefill's keep ratio for this request (None: the class's or server's;
    # 1.0: dense).
    sparse_prefill: float | None = None
    # Generate through the model's end-of-turn tokens (vLLM's `ignore_eos`; stop strings and
    # max_tokens still end it).
    ignore_eos: bool = False

    @property
    def conversation(self) -> Conversation | None:
        return self.prompt if isinstance(self.prompt, Conversation) else None


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """A dialect's stop field (one string or a list) as the engine's stop strings."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    return tuple(s for s in items if s)
