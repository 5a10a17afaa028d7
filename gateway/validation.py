"""Reject request fields that would change semantics but are not implemented yet (clear 400s,
never a silent ignore), and field combinations that make no sense. Sampling fields are all
implemented; `toolflash.gateway.sampling` checks them against the model (logit_bias ids)."""

from __future__ import annotations

from toolflash.gateway.errors import BadRequest, NotImplementedYet
from toolflash.gateway.protocol import ChatCompletionRequest, CompletionRequest


def _common(n: int | None) -> None:
    if n is not None and n > 1:
        raise NotImplementedYet("n > 1 is not implemented yet: request one choice", param="n")


def check_chat_supported(req: ChatCompletionRequest) -> None:
    """Raise a 400 for chat fields toolflash does not implement."""
    _common(req.n)
    if req.top_logprobs and not req.logprobs:
        raise BadRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    # response_format and tool_choice "required"/named are constrained decoding: the
    # constraint (and a 400 for a schema it cannot enforce) comes from gateway/structured.py.


def check_completion_supported(req: CompletionRequest) -> None:
    """Raise a 400 for text-completion fields toolflash does not implement."""
    _common(req.n)
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
