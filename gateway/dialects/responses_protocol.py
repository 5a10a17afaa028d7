"""OpenAI Responses API wire types (pydantic). Never imports mlx.

Requests allow extra fields (clients send more than we read) and `ignored_fields` names them for
the log. Input items, content parts and tools that would change what the model sees but are not
implemented (images, files, hosted tools, stored items) are refused with a 400 naming them, never
dropped silently.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, Field, field_validator, model_validator

from toolflash.gateway.protocol import OpenAIBaseModel, ToolflashInfo, checked_json_schema

# ---------------------------------------------------------------- input items


class InputText(OpenAIBaseModel):
    """A text part: `input_text` in user / system / developer turns, `output_text` (and
    `refusal`) in replayed assistant turns."""

    type: Literal["input_text", "output_text", "refusal"]
    text: str | None = None
    refusal: str | None = None

    @property
    def value(self) -> str:
        return (self.text if self.type != "refusal" else self.refusal) or ""


_PART_TYPES = ("input_text", "output_text", "refusal")


def _check_parts(content: Any) -> Any:
    """A clear 400 for content parts we do not implement (images, files, audio)."""
    if isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in _PART_TYPES:
                raise ValueError(
                    f"content part type '{kind}' is not supported (text only: "
                    f"{', '.join(_PART_TYPES)})"
                )
    return content


class MessageItem(OpenAIBaseModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]
    id: str | None = None
    status: str | None = None

    _parts = field_validator("content", mode="before")(_check_parts)

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.value for p in self.content)


class FunctionCallItem(OpenAIBaseModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None  # the namespace tool the function came from
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(OpenAIBaseModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    _parts = field_validator("output", mode="before")(_check_parts)

    @property
    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(p.value for p in self.output)


class ReasoningText(OpenAIBaseModel):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(OpenAIBaseModel):
    """A replayed reasoning item: its text (content, else summary) is the next assistant
    turn's reasoning; `encrypted_content` is never produced here and is not read."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        parts = self.content if self.content else self.summary
        return "\n".join(p.text for p in parts)


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
    Field(discriminator="type"),
]
_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def _check_items(value: Any) -> Any:
    """Items without `type` are messages (the SDK's EasyInputMessage); other item types
    (stored references, hosted tool calls) are a clear 400."""
    if not isinstance(value, list):
        return value
    out = []
    for i, item in enumerate(value):
        if isinstance(item, dict):
            kind = item.get("type")
            if kind is None and "role" in item:
                item = {**item, "type": "message"}
            elif kind == "item_reference":
                raise ValueError(
                    f"item {i}: item_reference needs stored responses, and nothing is stored "
                    "here (store: false): send the item itself"
                )
            elif isinstance(kind, str) and kind not in _ITEM_TYPES:
                raise ValueError(
                    f"item {i}: input item type '{kind}' is not supported (supported: "
                    f"{', '.join(_ITEM_TYPES)})"
                )
        out.append(item)
    return out


# ---------------------------------------------------------------- tools and options


class FunctionTool(OpenAIBaseModel):
    """A function tool. `strict` is true when left out, as the Responses API defines it: the
    call's arguments are then decoded under the tool's schema."""

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.:\-]{1,128}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = True

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is None:
            return None
        return checked_json_schema(schema)


class NamespaceTool(OpenAIBaseModel):
    """A named group of function tools (Codex sends its sub-agent tools so): each is offered
    to the model as a function, and its calls come back with `namespace` set."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[FunctionTool]


# Tools that OpenAI's servers run, never the client: they cannot run here, so they are not
# offered to the model (and are listed in `toolflash.ignored_fields`); a client loses nothing
# it would have executed itself. Client-run tools other than functions are refused.
HostedKind = Literal[
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "computer",
    "mcp",
]
HOSTED_TOOLS: tuple[str, ...] = get_args(HostedKind)


class HostedTool(OpenAIBaseModel):
    type: HostedKind

    def ignored_fields(self, prefix: str = "") -> list[str]:
        return []  # the whole tool is listed instead (`hosted_tools`)


ToolParam = Annotated[FunctionTool | NamespaceTool | HostedTool, Field(discriminator="type")]


def _check_tools(value: Any) -> Any:
    if isinstance(value, list):
        for i, tool in enumerate(value):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind not in ("function", "namespace", *HOSTED_TOOLS):
                raise ValueError(
                    f"tools[{i}]: tool type '{kind}' is not supported (client tools must be "
                    "function tools, or namespaces of them)"
                )
    return value


def function_tools(tools: list[Any] | None) -> list[tuple[FunctionTool, str | None]]:
    """The functions offered, each with the namespace it came from (None: top level)."""
    out: list[tuple[FunctionTool, str | None]] = []
    for t in tools or []:
        if isinstance(t, FunctionTool):
            out.append((t, None))
        elif isinstance(t, NamespaceTool):
            out += [(f, t.name) for f in t.tools]
    return out


class NamedFunctionChoice(OpenAIBaseModel):
    type: Literal["function"]
    name: str


class TextFormat(OpenAIBaseModel):
    """`text.format`: text, any JSON object, or JSON valid against `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema(self) -> TextFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError(
                "a json_schema format needs 'schema' (use type 'json_object' for any JSON object)"
            )
        return self


class TextConfig(OpenAIBaseModel):
    """`format` only; `verbosity` (a hint to OpenAI's models) is listed as ignored."""

    format: TextFormat | None = None


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ReasoningConfig(OpenAIBaseModel):
    """`effort` none turns the model's thinking off, any other effort on (absent: the chat
    template's default); `summary` is accepted, and the reasoning comes back whole."""

    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


def _check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return None
    if len(value) > 16:
        raise ValueError(f"at most 16 metadata pairs, got {len(value)}")
    for key, item in value.items():
        if len(key) > 64:
            raise ValueError(f"metadata key {key[:20]!r}... is longer than 64 characters")
        if len(item) > 512:
            raise ValueError(f"metadata value of {key!r} is longer than 512 characters")
    return value


# ---------------------------------------------------------------- request


class ResponsesRequest(OpenAIBaseModel):
    """POST /v1/responses."""

    input: str | Annotated[list[InputItem], Field(min_length=1)]
    model: str | None = None
    instructions: str | None = None
    tools: list[ToolParam] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    metadata: dict[str, str] | None = None
    stream: bool | None = False
    # Nothing is stored whatever `store` says; it is echoed as false.
    store: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    user: str | None = None
    # --8<-- [start:responses-extras]
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    # --8<-- [end:responses-extras]

    _items = field_validator("input", mode="before")(_check_items)
    _tools = field_validator("tools", mode="before")(_check_tools)
    _metadata = field_validator("metadata")(_check_metadata)

    @model_validator(mode="after")
    def _check(self) -> ResponsesRequest:
        names = [t.name for t, _ in function_tools(self.tools)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(dupes)}")
        choice = self.tool_choice
        if isinstance(choice, NamedFunctionChoice) and choice.name not in names:
            raise ValueError(f"tool_choice names '{choice.name}', which is not in tools")
        return self


# ---------------------------------------------------------------- response


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]
    namespace: str | None = None


class OutputReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = []
    content: list[OutputReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = OutputMessage | OutputFunctionCall | OutputReasoning


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    """The response object (the body, and the `response` of the stream's lifecycle events)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = []
    parallel_tool_calls: bool
    previous_response_id: None = None
    reasoning: dict[str, Any] | None = None
    store: bool = False
    temperature: float | None = None
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}
    toolflash: ToolflashInfo | None = None
