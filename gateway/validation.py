"""Reject request fields that would change semantics but are not implemented yet (clear 400s,
never a silent ignore). Sampling is the exception: the engine decodes greedily, temperature and
top_p are accepted and the response says `sampling: "greedy"` (agents send no temperature)."""

from __future__ import annotations

from toolflash.gateway.errors import NotImplementedYet
from toolflash.gateway.protocol import ChatCompletionRequest, CompletionRequest


def _common(
    n: int | None,
    frequency_penalty: float | None,
    presence_penalty: float | None,
    logit_bias: dict[str, float] | None,
) -> None:
    if n is not None and n > 1:
        raise NotImplementedYet("n > 1 is not implemented yet: request one choice", param="n")
    for name, value in (
        ("frequency_penalty", frequency_penalty),
        ("presence_penalty", presence_penalty),
    ):
        if value:
            raise NotImplementedYet(
                f"{name} is not implemented yet (decoding is greedy)", param=name
            )
    if logit_bias:
        raise NotImplementedYet("logit_bias is not implemented yet", param="logit_bias")


def check_chat_supported(req: ChatCompletionRequest) -> None:
    """Raise a 400 for chat fields toolflash does not implement."""
    _common(req.n, req.frequency_penalty, req.presence_penalty, req.logit_bias)
    if req.logprobs:
        raise NotImplementedYet("logprobs are not implemented yet", param="logprobs")
    if req.top_logprobs:
        raise NotImplementedYet("top_logprobs are not implemented yet", param="top_logprobs")
    # response_format and tool_choice "required"/named are constrained decoding: the
    # constraint (and a 400 for a schema it cannot enforce) comes from gateway/structured.py.


def check_completion_supported(req: CompletionRequest) -> None:
    """Raise a 400 for text-completion fields toolflash does not implement."""
    _common(req.n, req.frequency_penalty, req.presence_penalty, req.logit_bias)
    if req.logprobs:
        raise NotImplementedYet("logprobs are not implemented yet", param="logprobs")
    if req.echo:
        raise NotImplementedYet("echo is not implemented yet", param="echo")
    if req.suffix:
        raise NotImplementedYet(
            "suffix (fill-in-the-middle) is not implemented yet", param="suffix"
        )
    if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], list | str):
        if len(req.prompt) != 1:
            raise NotImplementedYet(
                "batched prompts are not implemented yet: send one prompt per request",
                param="prompt",
            )
