"""An upstream pool's model as the request path sees an engine: its context, how its tool calls
are spelled, and how the pool's text becomes the engine's events (`gateway/upstream_run.py`).

The upstream's tokenizer is not here: `encode`/`decode` count UTF-8 bytes (an upper bound of
tokens, used only for size checks and estimates); prompts are never rendered here, the
upstream renders its own chat template.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from toolflash.engine.api import EngineError, EngineEvent, GenerationRequest, ModeController
from toolflash.gateway.upstream_config import UpstreamPool


class UpstreamEngine:
    """The `Engine` view of an upstream pool's model."""

    draft_id: str | None = None
    vocab_size = 256  # bytes: see the module docstring
    max_token_chars = 1
    generation_defaults: Mapping[str, float] = {}  # the upstream applies its own

    def __init__(self, pool: UpstreamPool) -> None:
        self.model_id = pool.model
        self.context_length = pool.context_length
        self.tool_call_format: str = pool.tool_call_format

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(token_ids).decode(errors="replace")

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The conversation's JSON as bytes: a size bound, not the upstream's rendering."""
        return self.encode(json.dumps([list(messages), list(tools or ())], default=str))

    def stable_prefix(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        prompt: Sequence[int],
    ) -> int:
        return 0  # no prefix cache on this side: the upstream keeps its own

    def generate(
        self,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        controller: ModeController | None = None,
    ) -> Iterator[EngineEvent]:
        raise EngineError(
            f"{self.model_id} is served by an upstream pool: its requests stream over HTTP"
            " (gateway/upstream_run.py), never on the engine thread"
        )
