"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages dialect on the shared
request path (what Claude Code speaks through `ANTHROPIC_BASE_URL`).

Output pieces become content blocks in the order they come: reasoning a `thinking` block, text
a `text` block, each parsed tool call a `tool_use` block (calls are held until they parse whole,
so a `tool_use` block always carries a valid `input`). The stream sends Anthropic's event
sequence (`message_start`, `ping`, per block `content_block_start` / `_delta` / `_stop`,
`message_delta` with the stop reason and usage, `message_stop`); the complete response is the
fold of the same pieces. `stop_reason` is `tool_use` only when a tool_use block is there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from toolflash.engine.api import GenerationStats
from toolflash.gateway import sse
from toolflash.gateway.chat_output import ContentDelta, Delta, ReasoningDelta, ToolCallDelta
from toolflash.gateway.dialects.anthropic_protocol import (
    AnthropicUsage,
    ContentOut,
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
    StopReason,
    TextOut,
    ThinkingOut,
    ToolUseOut,
)
from toolflash.gateway.dialects.anthropic_request import conversation, messages_request
from toolflash.gateway.errors import GatewayError
from toolflash.gateway.handler import Parsed, handle
from toolflash.gateway.limits import check_max_tokens
from toolflash.gateway.prompt import chat_prompt
from toolflash.gateway.reader import Batch, Collected, Ending
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.run import RequestRun
from toolflash.gateway.serving import GatewayContext, gateway, parse_json, read_body

# Anthropic's error `type` for each status the gateway answers with.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    499: "invalid_request_error",
    500: "api_error",
    503: "overloaded_error",
}


def error_body(err: GatewayError) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}` (the status stays the error's)."""
    kind = _ERROR_TYPES.get(
        err.status, "api_error" if err.status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def tool_use_id(call_id: str) -> str:
    """Anthropic spells tool-use ids `toolu_...` (the gateway's are `call_...`)."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(ending: Ending) -> StopReason:
    if ending.finish_reason == "tool_calls":
        return "tool_use"
    if ending.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if ending.stop_sequence is not None else "end_turn"


def usage(s: GenerationStats) -> AnthropicUsage:
    return AnthropicUsage(
        input_tokens=s.prompt_tokens - s.cached_tokens,
        output_tokens=s.completion_tokens,
        cache_read_input_tokens=s.cached_tokens,
    )


def _kind(d: Delta) -> str:
    if isinstance(d, ReasoningDelta):
        return "thinking"
    if isinstance(d, ContentDelta):
        return "text"
    return "tool_use"


@dataclass
class _Block:
    kind: str  # text | thinking | tool_use
    text: str = ""  # text, thinking, or a tool call's arguments
    id: str = ""
    name: str = ""
    call: int = -1  # the tool call's index

    def out(self) -> ContentOut:
        if self.kind == "text":
            return TextOut(text=self.text)
        if self.kind == "thinking":
            return ThinkingOut(thinking=self.text)
        return ToolUseOut(id=self.id, name=self.name, input=json.loads(self.text or "{}"))


@dataclass
class BlockFold:
    """Deltas -> content blocks: a new block whenever the kind changes or a call starts."""

    blocks: list[_Block] = field(default_factory=list)

    def add(self, d: Delta) -> tuple[_Block, bool]:
        """The block `d` goes to, and whether it opened it."""
        last = self.blocks[-1] if self.blocks else None
        if isinstance(d, ToolCallDelta):
            if d.id is None and last is not None and last.call == d.index:
                last.text += d.arguments
                return last, False
            block = _Block("tool_use", d.arguments, tool_use_id(d.id or ""), d.name or "", d.index)
        elif last is not None and last.kind == _kind(d):
            last.text += d.text
            return last, False
        else:
            block = _Block(_kind(d), d.text)
        self.blocks.append(block)
        return block, True


def _event(kind: str, **data: Any) -> str:
    return sse.named(kind, {"type": kind, **data})


class MessagesStream:
    """Anthropic's event sequence for one response."""

    def __init__(self, run: RequestRun) -> None:
        self.run = run
        self.fold = BlockFold()
        self.open = False  # the last block is started and not stopped

    def start(self) -> str:
        assert self.run.prepared is not None
        message = {
            "id": self.run.request_id,
            "type": "message",
            "role": "assistant",
            "model": self.run.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": len(self.run.prepared.request.prompt_tokens),
                "output_tokens": 0,
            },
        }
        return _event("message_start", message=message) + _event("ping")

    def _stop(self, index: int) -> str:
        """Close block `index` if it is open (a thinking block gets its signature first)."""
        if not self.open:
            return ""
        self.open = False
        out = ""
        if self.fold.blocks[index].kind == "thinking":
            out += _event(
                "content_block_delta",
                index=index,
                delta={"type": "signature_delta", "signature": ""},
            )
        return out + _event("content_block_stop", index=index)

    def batch(self, batch: Batch) -> str:
        out = ""
        for d in batch.deltas:
            piece = d.arguments if isinstance(d, ToolCallDelta) else d.text
            if not piece and not isinstance(d, ToolCallDelta):
                continue
            before = len(self.fold.blocks) - 1
            block, opened = self.fold.add(d)
            index = len(self.fold.blocks) - 1
            if opened:
                out += self._stop(before)
                start: dict[str, Any] = {"type": block.kind}
                if block.kind == "tool_use":
                    start.update(id=block.id, name=block.name, input={})
                else:
                    start[block.kind] = ""
                out += _event("content_block_start", index=index, content_block=start)
                self.open = True
            if not piece:
                continue
            if block.kind == "text":
                delta = {"type": "text_delta", "text": piece}
            elif block.kind == "thinking":
                delta = {"type": "thinking_delta", "thinking": piece}
            else:
                delta = {"type": "input_json_delta", "partial_json": piece}
            out += _event("content_block_delta", index=index, delta=delta)
        return out

    def end(self, ending: Ending) -> str:
        out = self._stop(len(self.fold.blocks) - 1)
        info = self.run.info().model_dump(mode="json")
        return (
            out
            + _event(
                "message_delta",
                delta={"stop_reason": stop_reason(ending), "stop_sequence": ending.stop_sequence},
                usage=usage(ending.stats).model_dump(),
                toolflash=info,
            )
            + _event("message_stop")
        )

    def error(self, err: GatewayError) -> str:
        return sse.named("error", error_body(err))


class MessagesDialect:
    api = "messages"
    id_prefix = "msg"

    def parse(self, body: dict[str, Any], ctx: GatewayContext) -> Parsed:
        req = MessagesRequest.model_validate(body)
        model = ctx.resolve_model(req.model)
        check_max_tokens(req.max_tokens, ctx.engine().context_length, "max_tokens")
        return Parsed(req, model, bool(req.stream), req.ignored_fields())

    def request(self, wire: MessagesRequest) -> ApiRequest:
        return messages_request(wire)

    def response(self, run: RequestRun, parsed: Parsed, result: Collected) -> dict[str, Any]:
        fold = BlockFold()
        for d in result.deltas:
            if isinstance(d, ToolCallDelta) or d.text:
                fold.add(d)
        message = MessageResponse(
            id=run.request_id,
            model=run.model,
            content=[b.out() for b in fold.blocks],
            stop_reason=stop_reason(result.ending),
            stop_sequence=result.ending.stop_sequence,
            usage=usage(result.ending.stats),
            toolflash=run.info(),
        )
        return message.model_dump(mode="json")

    def encoder(self, run: RequestRun, parsed: Parsed) -> MessagesStream:
        return MessagesStream(run)

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        return error_body(err)


MESSAGES = MessagesDialect()


async def create_message(request: Request) -> Response:
    return await handle(request, MESSAGES)


async def count_tokens(request: Request) -> Response:
    """The prompt tokens a Messages request would have (rendered with the chat template, tools
    included), without generating."""
    ctx = gateway(request)
    raw = await read_body(request, ctx.config.max_body_bytes)
    engine = ctx.engine()

    def count() -> int:
        req = CountTokensRequest.model_validate(parse_json(raw, ctx.config.max_json_depth))
        ctx.resolve_model(req.model)
        return len(chat_prompt(conversation(req), engine).tokens)

    n = await ctx.offload(count)
    return JSONResponse(CountTokensResponse(input_tokens=n).model_dump())
