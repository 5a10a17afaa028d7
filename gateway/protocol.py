"""OpenAI wire types for the gateway (pydantic). Never imports mlx.

Fields follow the OpenAI reference order; toolflash extras sit below the `# --8<--` markers.
Clients send fields we do not know: models allow extras and `ignored_fields` names them so the
server can log them. Fields that would change semantics but are not implemented are rejected by
`toolflash.gateway.validation`, not here, so their error names the feature.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import jsonschema
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    field_validator,
    model_validator,
)


class OpenAIBaseModel(BaseModel):
    """Base for request models: extra fields are accepted and reported by `ignored_fields`."""

    model_config = ConfigDict(extra="allow")

    def ignored_fields(self, prefix: str = "") -> list[str]:
        """Dotted names of fields present in the request but not part of the model."""
        names = [f"{prefix}{k}" for k in (self.model_extra or {})]
        for key in type(self).model_fields:
            value = getattr(self, key)
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                if isinstance(item, OpenAIBaseModel):
                    sub = f"{prefix}{key}[{i}]." if isinstance(value, list) else f"{prefix}{key}."
                    names += item.ignored_fields(sub)
        return names


# ---------------------------------------------------------------- messages


class ContentPart(OpenAIBaseModel):
    """A content part; only text parts are supported."""

    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type != "text":
            raise ValueError(f"content part type '{self.type}' is not supported (text only)")
        if self.text is None:
            raise ValueError("a text content part needs 'text'")
        return self


Content = str | list[ContentPart]


def content_text(content: Content | None) -> str:
    """The plain text of a message content."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text or "" for p in content)


class SystemMessage(OpenAIBaseModel):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(OpenAIBaseModel):
    role: Literal["user"]
    content: Content
    name: str | None = None


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str


class ToolCall(OpenAIBaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(OpenAIBaseModel):
    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    # --8<-- [start:assistant-extras]
    reasoning_content: str | None = None
    # --8<-- [end:assistant-extras]


class ToolMessage(OpenAIBaseModel):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


# ---------------------------------------------------------------- tools


def checked_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` when it is a valid JSON schema (its draft, else 2020-12), else ValueError (a
    tool's parameters in every dialect)."""
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"not a valid JSON schema: {exc.message}") from None
    return schema


class FunctionDefinition(OpenAIBaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.:\-]{1,128}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is None:
            return None
        return checked_json_schema(schema)


class ToolDefinition(OpenAIBaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


# ---------------------------------------------------------------- requests

# Every stop string is matched after every token on the engine thread: a few, of sane length
# (OpenAI takes up to 4), so no request can slow everyone's decoding with thousands.
StopString = Annotated[str, Field(max_length=1024)]
Stop = StopString | Annotated[list[StopString], Field(max_length=16)]


def check_logit_bias(bias: dict[str, float] | None) -> dict[str, float] | None:
    """OpenAI's shape: token-id strings -> a bias in [-100, 100] (ids are checked against the
    model's vocabulary when the request is prepared)."""
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10):
            raise ValueError(f"keys must be token ids (non-negative integers), got {key[:20]!r}")
        if not -100 <= value <= 100:
            raise ValueError(f"bias for token {key} must be between -100 and 100, got {value}")
    return bias


class ChatCompletionRequest(OpenAIBaseModel):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    response_format: ResponseFormat | None = None
    seed: int | None = None
    stop: Stop | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    # --8<-- [start:chat-extras]
    chat_template_kwargs: dict[str, Any] | None = None
    # Sampling extras (the openai SDK sends them through extra_body); -1 or 0: top_k off.
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    # Opt-in positional sparse prefill: compute about this share of a long prompt (1: dense).
    sparse_prefill: float | None = Field(default=None, gt=0, le=1)
    # vLLM's: generate through the model's end-of-turn tokens (fixed-length benchmarks).
    ignore_eos: bool | None = None
    # --8<-- [end:chat-extras]

    _logit_bias = field_validator("logit_bias")(check_logit_bias)

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        names = [t.function.name for t in self.tools or []]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(dupes)}")
        if (
            isinstance(self.tool_choice, NamedToolChoice)
            and self.tool_choice.function.name not in names
        ):
            raise ValueError(
                f"tool_choice names '{self.tool_choice.function.name}', which is not in tools"
            )
        return self


class CompletionRequest(OpenAIBaseModel):
    """POST /v1/completions (legacy text completion)."""

    prompt: str | list[str] | list[NonNegativeInt] | list[list[NonNegativeInt]]
    model: str | None = None
    echo: bool | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    stop: Stop | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    user: str | None = None
    # --8<-- [start:completion-extras]
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    sparse_prefill: float | None = Field(default=None, gt=0, le=1)
    ignore_eos: bool | None = None
    # --8<-- [end:completion-extras]

    _logit_bias = field_validator("logit_bias")(check_logit_bias)


# ---------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class ToolCallReportModel(BaseModel):
    index: int
    name: str
    parsed: bool
    error: str | None = None
    schema_valid: bool | None = None
    schema_errors: list[str] = []


class Decision(BaseModel):
    """A decoding decision: the mode chosen from a cycle on, and why (a policy's
    `DecisionRecord`: also the span kind it was made in and the kind of decision)."""

    cycle: int
    mode: str
    block_size: int | None = None
    reason: str
    span: str | None = None
    kind: str | None = None


class Timings(BaseModel):
    queue_s: float
    prefill_s: float
    decode_s: float
    ttft_s: float | None
    e2e_s: float


class SamplingInfo(BaseModel):
    """The sampling a response was decoded with: request fields, else the model's
    generation_config.json defaults, else greedy. `seed` is the request's or the one drawn
    for it (send it back to reproduce the output in the same mode)."""

    method: Literal["greedy", "sample"]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None
    frequency_penalty: float
    presence_penalty: float
    logit_bias_tokens: int
    from_model_defaults: list[str] = []


class StructuredOutputCheck(BaseModel):
    valid: bool
    error: str | None = None


class ConstraintInfo(BaseModel):
    """What the output constraint (grammar masks) did: mask rows computed and their cost,
    drafted tokens the grammar checked and how many it rejected (cutting `grammar_cuts`
    drafts), and the grammar-forced runs verified without drafting."""

    mask_rows: int
    mask_s: float
    drafted_checked: int
    grammar_rejected: int
    grammar_cuts: int
    forced_runs: int
    forced_tokens: int


class ToolflashInfo(BaseModel):
    """How a response was decoded (the `toolflash` object in bodies and the final chunk)."""

    request_id: str
    request_class: str
    mode: str
    modes: list[str]
    sampling: SamplingInfo
    cycles: int
    spec_cycles: int
    tokens_per_cycle: float
    drafted: int
    accepted: int
    decisions: list[Decision]
    max_tokens: int
    max_tokens_clamped: bool
    decode_tokens_per_s: float
    timings: Timings
    # The largest batch its decode steps ran in, as a band: "1" (alone), "2-3", "4-7", ...
    batch_band: str = "1"
    tool_calls: list[ToolCallReportModel] = []
    rejected_tool_spans: list[dict[str, Any]] = []
    ignored_fields: list[str] = []
    # response_format JSON: the final jsonschema check of the answer ({"valid", "error"}).
    structured_output: StructuredOutputCheck | None = None
    # Grammar-constrained requests (response_format JSON, forced or strict tool calls).
    constraint: ConstraintInfo | None = None
    # Whether the prefill ran sparse (some prompt chunks never computed) and how many prompt
    # tokens it computed (the prefix cache's and the dropped ones not counted).
    prefill_sparse: bool = False
    prefill_computed_tokens: int = 0


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


FinishReasonWire = Literal["stop", "length", "tool_calls"]


class TopLogprobModel(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobModel(TopLogprobModel):
    top_logprobs: list[TopLogprobModel]


class ChoiceLogprobs(BaseModel):
    """Chat `logprobs`: one entry per output token (the target's raw log-probabilities)."""

    content: list[TokenLogprobModel] | None
    refusal: list[TokenLogprobModel] | None = None


class CompletionLogprobs(BaseModel):
    """Legacy completions `logprobs`: parallel lists per output token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class ChatChoice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReasonWire
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    toolflash: ToolflashInfo


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReasonWire | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    toolflash: ToolflashInfo | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    toolflash: ToolflashInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "toolflash"
    context_length: int | None = None
    draft: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
