"""A request's prompt as token ids: a conversation rendered with the chat template (with its
output constraint and stable prefix), or a raw text / token-id prompt.

`render_prompt` runs on the gateway's render threads (`GatewayContext.offload`), not on the
engine thread: a template, a schema compile or a long tokenization then cannot hold up the
request being decoded, and a time budget bounds each one. It refuses, without rendering
anything, a prompt whose text cannot fit the context.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolflash.engine.api import Engine, OutputConstraint
from toolflash.gateway.errors import BadRequest
from toolflash.gateway.limits import check_prompt_chars, check_token_ids
from toolflash.gateway.request import ApiRequest, Conversation, TextPrompt
from toolflash.gateway.structured import build_constraint, for_prompt, reasoning_mode


@dataclass(frozen=True)
class Prompt:
    """What the worker needs from a rendered request."""

    tokens: tuple[int, ...]
    publish_at: tuple[int, ...] = ()  # where the prefix cache publishes (the stable prefix)
    start_in_reasoning: bool = False
    constraint: OutputConstraint | None = None  # bound to the engine's tool format and prompt


def render_prompt(req: ApiRequest, engine: Engine) -> Prompt:
    """Check, render and tokenize a request's prompt (on a render thread)."""
    if isinstance(req.prompt, Conversation):
        return chat_prompt(req.prompt, engine)
    return text_prompt(req.prompt, engine)


def text_prompt(prompt: TextPrompt, engine: Engine) -> Prompt:
    """Text is tokenized once it could fit the context; ids must index the model's vocabulary
    (ids past it reached MLX's embedding)."""
    if prompt.text is not None:
        check_prompt_chars(
            len(prompt.text), engine.context_length, engine.max_token_chars, "prompt"
        )
        return Prompt(tuple(engine.encode(prompt.text)))
    ids = prompt.token_ids or ()
    check_token_ids(ids, engine.vocab_size)
    return Prompt(tuple(ids))


def chat_prompt(conv: Conversation, engine: Engine) -> Prompt:
    """Check, render and tokenize a conversation (on a render thread)."""
    check_prompt_chars(
        conv.verbatim_chars, engine.context_length, engine.max_token_chars, "messages"
    )
    # JSON answers / forced or strict tools: a grammar (a bad schema is a 400 here).
    constraint = build_constraint(conv)
    messages = [dict(m) for m in conv.messages]
    tools = conv.offered_tools
    template_kwargs = dict(conv.template_kwargs)
    tokens = render(engine, messages, tools, template_kwargs)
    # Templates that open the answer inside <think> leave the tag at the prompt's end.
    tail = engine.decode(tokens[-8:])
    start_in_reasoning = tail.rstrip().endswith("<think>")
    bound = (
        for_prompt(
            constraint,
            engine.tool_call_format,
            reasoning_mode(tail, template_kwargs.get("enable_thinking"), start_in_reasoning),
        )
        if constraint is not None
        else None
    )
    # The prefix cache publishes here so the agent's next turn (same history plus more)
    # restores instead of recomputing. `tokens` is this thread's last encode_chat result: the
    # real engine reads the prefix length off that tokenization instead of tokenizing again.
    n = engine.stable_prefix(messages, tools, template_kwargs, tokens) if tokens else 0
    return Prompt(tuple(tokens), (n,) if n > 0 else (), start_in_reasoning, bound)


def render(
    engine: Engine,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: Mapping[str, Any],
) -> list[int]:
    """Apply the chat template; a template that refuses the conversation (jinja's
    `raise_exception`, e.g. a misplaced system message) is the client's error, not ours."""
    try:
        return engine.encode_chat(messages, tools, template_kwargs)
    except Exception as exc:
        if type(exc).__module__.startswith("jinja2"):
            raise BadRequest(f"the chat template rejected the messages: {exc}") from None
        raise
