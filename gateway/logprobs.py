"""Engine `TokenLogprob`s -> OpenAI's logprobs shapes (chat and legacy completions).

The values are the target's raw log-probabilities (before temperature, penalties, bias,
top-k/top-p/min-p and grammar masks), the same in AR and speculative mode. `bytes` is the
UTF-8 encoding of the token's text as decoded alone (a token holding part of a multi-byte
character decodes to U+FFFD, as in vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence

from toolflash.engine.api import TokenLogprob
from toolflash.gateway.protocol import (
    ChoiceLogprobs,
    CompletionLogprobs,
    TokenLogprobModel,
    TopLogprobModel,
)


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def chat_logprobs(items: Sequence[TokenLogprob]) -> ChoiceLogprobs:
    """`choices[].logprobs` of a chat completion or chunk."""
    return ChoiceLogprobs(
        content=[
            TokenLogprobModel(
                token=t.text,
                logprob=t.logprob,
                bytes=_bytes(t.text),
                top_logprobs=[
                    TopLogprobModel(token=a.text, logprob=a.logprob, bytes=_bytes(a.text))
                    for a in t.top
                ],
            )
            for t in items
        ]
    )


def completion_logprobs(items: Sequence[TokenLogprob], offset: int = 0) -> CompletionLogprobs:
    """`choices[].logprobs` of a text completion; `offset` is where the first token's text
    starts in the completion (streamed chunks continue the previous chunk's offsets). As in
    OpenAI's API, `top_logprobs` always holds the sampled token besides the top alternatives."""
    offsets: list[int] = []
    for t in items:
        offsets.append(offset)
        offset += len(t.text)
    tops: list[dict[str, float]] = []
    for t in items:
        top = {a.text: a.logprob for a in t.top}
        top.setdefault(t.text, t.logprob)
        tops.append(top)
    return CompletionLogprobs(
        tokens=[t.text for t in items],
        token_logprobs=[t.logprob for t in items],
        top_logprobs=tops,
        text_offset=offsets,
    )
