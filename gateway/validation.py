"""Reject request fields that would change semantics but are not implemented yet (clear 400s,
never a silent ignore), and field combinations that make no sense. Sampling fields are all
implemented; `toolflash.gateway.sampling` checks them against the model (logit_bias ids)."""

from __future__ import annotations

from toolflash.gateway.config import RESERVED_TEMPLATE_KWARGS, GatewayConfig
from toolflash.gateway.errors import BadRequest, NotImplementedYet
from toolflash.gateway.limits import check_max_tokens, check_template_kwargs
from toolflash.gateway.protocol import ChatCompletionRequest, CompletionRequest


def _common(n: int | None) -> None:
    if n is not None and n > 1:
        raise NotImplementedYet("n > 1 is not implemented yet: request one choice", param="n")


def check_chat_supported(
    req: ChatCompletionRequest, config: GatewayConfig, context_length: int
) -> None:
    """Raise a 400 for chat fields toolflash does not implement or does not let a client set,
    and for limits no prompt could meet."""
    _common(req.n)
    if req.top_logprobs and not req.logprobs:
        raise BadRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.model_extra and "chat_template" in req.model_extra:
        # vLLM's extra field; a client template would run unbounded on the server.
        raise BadRequest(
            "chat_template: custom chat templates are not accepted; the model's own "
            "template renders every request",
            param="chat_template",
        )
    check_template_kwargs(
        req.chat_template_kwargs,
        config.template_kwargs,
        RESERVED_TEMPLATE_KWARGS,
        config.max_template_kwarg_chars,
    )
    field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    check_max_tokens(req.max_completion_tokens or req.max_tokens, context_length, field)
    # response_format and tool_choice "required"/named are constrained decoding: the
    # constraint (and a 400 for a schema it cannot enforce) comes from gateway/structured.py.


def check_completion_supported(req: CompletionRequest, context_length: int) -> None:
    """Raise a 400 for text-completion fields toolflash does not implement, and for limits no
    prompt could meet."""
    _common(req.n)
    check_max_tokens(req.max_tokens, context_length, "max_tokens")
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
