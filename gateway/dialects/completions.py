"""POST /v1/completions: raw text in, raw text out (no template, no tool or reasoning parsing),
the legacy OpenAI dialect on the shared request path."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from toolflash.engine.api import TokenLogprob
from toolflash.gateway import sse
from toolflash.gateway.dialects.chat import usage
from toolflash.gateway.dialects.openai_request import completion_request
from toolflash.gateway.errors import GatewayError
from toolflash.gateway.handler import Parsed, handle
from toolflash.gateway.logprobs import completion_logprobs
from toolflash.gateway.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from toolflash.gateway.reader import Batch, Collected, Ending
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.run import RequestRun
from toolflash.gateway.serving import GatewayContext
from toolflash.gateway.validation import check_completion_supported


def _text(batch_deltas: list[Any]) -> str:
    return "".join(d.text for d in batch_deltas)


class CompletionStream:
    """`text_completion` chunks: one per batch (its tokens' log-probabilities, offsets
    continuing), the finish chunk, the usage chunk when asked, then `[DONE]`."""

    def __init__(self, run: RequestRun, include_usage: bool) -> None:
        self.run = run
        self.include_usage = include_usage
        self.created = int(time.time())
        self.offset = 0  # where the next token's text starts

    def _chunk(self, **kw: Any) -> str:
        run = self.run
        return sse.event(Completion(id=run.request_id, created=self.created, model=run.model, **kw))

    def _logprobs(self, items: list[TokenLogprob]) -> CompletionLogprobs | None:
        if not self.run.wants_logprobs:
            return None
        out = completion_logprobs(items, self.offset)
        self.offset += sum(len(t.text) for t in items)
        return out

    def start(self) -> str:
        return ""

    def batch(self, batch: Batch) -> str:
        lp = self._logprobs(batch.logprobs)
        choice = CompletionChoice(text=_text(batch.deltas), finish_reason=None, logprobs=lp)
        return self._chunk(choices=[choice])

    def end(self, ending: Ending) -> str:
        info = self.run.info()
        final = CompletionChoice(
            text="", finish_reason=ending.finish_reason, logprobs=self._logprobs(ending.logprobs)
        )
        # The last chunks and [DONE] in one write.
        end = self._chunk(choices=[final], toolflash=None if self.include_usage else info)
        if self.include_usage:
            end += self._chunk(choices=[], usage=usage(ending.stats), toolflash=info)
        return end + sse.DONE

    def error(self, err: GatewayError) -> str:
        return sse.event(err.body()) + sse.DONE


class CompletionsDialect:
    api = "completions"
    id_prefix = "cmpl"

    def parse(self, body: dict[str, Any], ctx: GatewayContext) -> Parsed:
        req = CompletionRequest.model_validate(body)
        model = ctx.resolve_model(req.model)
        check_completion_supported(req, ctx.engine().context_length)
        return Parsed(req, model, bool(req.stream), req.ignored_fields())

    def request(self, wire: CompletionRequest) -> ApiRequest:
        return completion_request(wire)

    def response(self, run: RequestRun, parsed: Parsed, result: Collected) -> dict[str, Any]:
        lp = completion_logprobs(result.logprobs) if run.wants_logprobs else None
        body = Completion(
            id=run.request_id,
            created=int(time.time()),
            model=run.model,
            choices=[
                CompletionChoice(
                    text=_text(result.deltas),
                    finish_reason=result.ending.finish_reason,
                    logprobs=lp,
                )
            ],
            usage=usage(result.ending.stats),
            toolflash=run.info(),
        )
        return body.model_dump(mode="json")

    def encoder(self, run: RequestRun, parsed: Parsed) -> CompletionStream:
        req: CompletionRequest = parsed.wire
        return CompletionStream(run, bool(req.stream_options and req.stream_options.include_usage))

    def error_body(self, err: GatewayError) -> dict[str, Any]:
        return err.body()


COMPLETIONS = CompletionsDialect()


async def create_completion(request: Request) -> Response:
    return await handle(request, COMPLETIONS)
