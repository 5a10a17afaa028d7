"""POST /v1/responses: the OpenAI Responses dialect on the shared request path (what Codex CLI and
the OpenAI Agents SDK speak).

Output pieces become output items in the order they come: reasoning a `reasoning` item (its text
as `reasoning_text` content), text a `message` item with one `output_text` part, each parsed tool
call a `function_call` item (calls are held until they parse whole, so a `function_call` item
always carries valid arguments for a declared tool). The stream sends the typed event sequence
(`response.created`, `response.in_progress`, per item `response.output_item.added`, its part's
`response.content_part.added`, deltas, `.done` events, `response.output_item.done`, then
`response.completed`, or `response.incomplete` when max_output_tokens cut it, and the Open
Responses terminator `data: [DONE]`), every event with its `sequence_number`; the complete
response is the fold of the same pieces. Nothing is stored: `store` is echoed as false and
`previous_response_id` is a 400.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from toolflash.engine.api import GenerationStats
from toolflash.gateway import sse
from toolflash.gateway.chat_output import ContentDelta, Delta, ReasoningDelta, ToolCallDelta
from toolflash.gateway.dialects.responses_protocol import (
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputReasoningText,
    OutputText,
    OutputTokensDetails,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    function_tools,
)
from toolflash.gateway.dialects.responses_request import (
    check_responses_supported,
    hosted_tools,
    responses_request,
)
from toolflash.gateway.errors import GatewayError
from toolflash.gateway.handler import Parsed, handle
from toolflash.gateway.limits import check_max_tokens
from toolflash.gateway.reader import Batch, Collected, Ending
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.run import RequestRun
from toolflash.gateway.serving import GatewayContext

Status = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _kind(d: Delta) -> str:
    if isinstance(d, ReasoningDelta):
        return "reasoning"
    if isinstance(d, ContentDelta):
        return "message"
    return "function_call"


@dataclass
class _Item:
    kind: str  # reasoning | message | function_call
    id: str
    text: str = ""  # reasoning text, message text, or a call's arguments
    call_id: str = ""
    name: str = ""
    call: int = -1  # the tool call's index
    namespace: str | None = None  # the namespace tool the called function came from

    def out(self, status: Status) -> OutputItem:
        if self.kind == "reasoning":
            return OutputReasoning(
                id=self.id,
                content=[OutputReasoningText(text=self.text)] if self.text else [],
                status=status,
            )
        if self.kind == "message":
            return OutputMessage(
                id=self.id,
                status=status,
                content=[OutputText(text=self.text)] if status != "in_progress" else [],
            )
        return OutputFunctionCall(
            id=self.id,
            call_id=self.call_id,
            name=self.name,
            arguments=self.text if status != "in_progress" else "",
            namespace=self.namespace,
            status=status,
        )


@dataclass
class ItemFold:
    """Deltas -> output items: a new item whenever the kind changes or a call starts;
    `namespaces` maps a function offered inside a namespace tool to that namespace."""

    namespaces: dict[str, str] = field(default_factory=dict)
    items: list[_Item] = field(default_factory=list)

    def add(self, d: Delta) -> tuple[_Item, bool]:
        """The item `d` goes to, and whether it opened it."""
        last = self.items[-1] if self.items else None
        if isinstance(d, ToolCallDelta):
            if d.id is None and last is not None and last.call == d.index:
                last.text += d.arguments
                return last, False
            call_id = d.id or ""
            item = _Item(
                "function_call",
                "fc_" + call_id.removeprefix("call_"),
                d.arguments,
                call_id,
                d.name or "",
                d.index,
                self.namespaces.get(d.name or ""),
            )
        elif last is not None and last.kind == _kind(d):
            last.text += d.text
            return last, False
        else:
            kind = _kind(d)
            item = _Item(kind, _item_id("rs" if kind == "reasoning" else "msg"), d.text)
        self.items.append(item)
        return item, True

    def outputs(self, ending: Ending) -> list[OutputItem]:
        """The finished items (the last one incomplete when max_output_tokens cut it)."""
        cut = ending.finish_reason == "length"
        n = len(self.items)
        return [
            it.out("incomplete" if cut and i == n - 1 else "completed")
            for i, it in enumerate(self.items)
        ]


def fold_for(req: ResponsesRequest) -> ItemFold:
    return ItemFold({t.name: ns for t, ns in function_tools(req.tools) if ns is not None})


def _shown(d: Delta) -> bool:
    return isinstance(d, ToolCallDelta) or bool(d.text)


def usage(s: GenerationStats, reasoning_tokens: int) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=s.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=s.cached_tokens),
        output_tokens=s.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
        total_tokens=s.prompt_tokens + s.completion_tokens,
    )


def reasoning_tokens(run: RequestRun, fold: ItemFold) -> int:
    """The reasoning's tokens, re-tokenized from its text (the engine counts output tokens, not
    which channel they went to; a boundary token may count one off)."""
    text = "".join(it.text for it in fold.items if it.kind == "reasoning")
    return len(run.ctx.engine().encode(text)) if text else 0


def echo(req: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as the response object repeats them."""
    fmt = req.text.format if req.text else None
    choice = req.tool_choice
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "reasoning": req.reasoning.model_dump(include={"effort", "summary"})
        if req.reasoning
        else None,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "text": {
            "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        },
        "tool_choice": choice.model_dump()
        if choice is not None and not isinstance(choice, str)
        else (choice or "auto"),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "user": req.user,
        "metadata": req.metadata or {},
    }


def response_object(
    run: RequestRun,
    wire: ResponsesRequest,
    created: int,
    *,
    status: ResponseStatus,
    output: list[OutputItem] | None = None,
    ending: Ending | None = None,
    reasoning: int = 0,
    error: GatewayError | None = None,
) -> ResponseObject:
    cut = ending is not None and ending.finish_reason == "length"
    return ResponseObject(
        id=run.request_id,
        created_at=created,
        status=status,
        error=ResponseError(code=error.code or error.type, message=error.message)
        if error
        else None,
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if cut else None,
        model=run.model,
        output=output or [],
        usage=usage(ending.stats, reasoning) if ending else None,
        toolflash=run.info() if ending or error else None,
        **echo(wire),
    )


def final_status(ending: Ending) -> ResponseStatus:
    return "incomplete" if ending.finish_reason == "length" else "completed"


class ResponsesStream:
    """The Responses API's typed event sequence for one response."""

    def __init__(self, run: RequestRun, wire: ResponsesRequest) -> None:
        self.run = run
        self.wire = wire
        self.created = int(time.time())
        self.fold = fold_for(wire)
        self.seq = 0
        self.open = False  # the last item is added and not done

    def _event(self, kind: str, **data: Any) -> str:
        out = sse.named(kind, {"type": kind, "sequence_number": self.seq, **data})
        self.seq += 1
        return out

    def _response(self, status: ResponseStatus, **kw: Any) -> dict[str, Any]:
        obj = response_object(self.run, self.wire, self.created, status=status, **kw)
        return obj.model_dump(mode="json")

    def start(self) -> str:
        head = self._response("in_progress")
        return self._event("response.created", response=head) + self._event(
            "response.in_progress", response=head
        )

    def _where(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": self.fold.items.index(item)}

    def _added(self, item: _Item) -> str:
        index = len(self.fold.items) - 1
        out = self._event(
            "response.output_item.added",
            output_index=index,
            item=item.out("in_progress").model_dump(mode="json"),
        )
        if item.kind == "message":
            part = OutputText(text="").model_dump(mode="json")
        elif item.kind == "reasoning":
            part = OutputReasoningText(text="").model_dump(mode="json")
        else:
            return out
        return out + self._event(
            "response.content_part.added", **self._where(item), content_index=0, part=part
        )

    def _done(self, item: _Item, status: Status) -> str:
        """The closing events of `item`."""
        where = self._where(item)
        out = ""
        if item.kind == "function_call":
            out += self._event(
                "response.function_call_arguments.done",
                **where,
                name=item.name,
                arguments=item.text,
            )
        else:
            text_kind = "output_text" if item.kind == "message" else "reasoning_text"
            extra: dict[str, Any] = {"logprobs": []} if item.kind == "message" else {}
            out += self._event(
                f"response.{text_kind}.done", **where, content_index=0, text=item.text, **extra
            )
            part = (
                OutputText(text=item.text)
                if item.kind == "message"
                else OutputReasoningText(text=item.text)
            )
            out += self._event(
                "response.content_part.done",
                **where,
                content_index=0,
                part=part.model_dump(mode="json"),
            )
        return out + self._event(
            "response.output_item.done",
            output_index=where["output_index"],
            item=item.out(status).model_dump(mode="json"),
        )

    def batch(self, batch: Batch) -> str:
        out = ""
        for d in batch.deltas:
            if not _shown(d):
                continue
            before = self.fold.items[-1] if self.fold.items else None
            item, opened = self.fold.add(d)
            if opened:
                if before is not None and self.open:
                    out += self._done(before, "completed")
                out += self._added(item)
                self.open = True
            piece = d.arguments if isinstance(d, ToolCallDelta) else d.text
            if not piece:
                continue
            where = self._where(item)
            if item.kind == "function_call":
                out += self._event("response.function_call_arguments.delta", **where, delta=piece)
            elif item.kind == "message":
                out += self._event(
                    "response.output_text.delta", **where, content_index=0, delta=piece, logprobs=[]
                )
            else:
                out += self._event(
                    "response.reasoning_text.delta", **where, content_index=0, delta=piece
                )
        return out

    def end(self, ending: Ending) -> str:
        out = ""
        if self.open and self.fold.items:
            cut = ending.finish_reason == "length"
            out += self._done(self.fold.items[-1], "incomplete" if cut else "completed")
            self.open = False
        status = final_status(ending)
        body = self._response(
            status,
            output=self.fold.outputs(ending),
            ending=ending,
            reasoning=reasoning_tokens(self.run, self.fold),
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, response=body) + sse.DONE

    def error(self, err: GatewayError) -> str:
        """An `error` event, then `response.failed` (the stream's end)."""
        out = self._event("error", code=err.code or err.type, message=err.message, param=err.param)
        failed = self._response("failed", error=err)
        return out + self._event("response.failed", response=failed) + sse.DONE


class ResponsesDialect:
    api = "responses"
    id_prefix = "resp"

    def parse(self, body: dict[str, Any], ctx: GatewayContext) -> Parsed:
        req = ResponsesRequest.model_validate(body)
        check_responses_supported(req)
        model = ctx.resolve_model(req.model)
        check_max_tokens(req.max_output_tokens, ctx.engine().context_length, "max_output_tokens")
        return Parsed(req, model, bool(req.stream), req.ignored_fields() + hosted_tools(req))

    def request(self, wire: ResponsesRequest) -> ApiRequest:
        return responses_request(wire)

    def response(self, run: RequestRun, parsed: Parsed, result: Collected) -> dict[str, Any]:
        fold = fold_for(parsed.wire)
        for d in result.deltas:
            if _shown(d):
                fold.add(d)
        ending = result.ending
        body = response_object(
            run,
            parsed.wire,
            int(time.time()),
            status=final_status(ending),
            output=fold.outputs(ending),
            ending=ending,
            reasoning=reasoning_tokens(run, fold),
        )
        return body.model_dump(mode="json")

    def encoder(self, run: RequestRun, parsed: Parsed) -> ResponsesStream:
        return ResponsesStream(run, parsed.wire)

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        return err.body()


RESPONSES = ResponsesDialect()


async def create_response(request: Request) -> Response:
    return await handle(request, RESPONSES)
