"""Gateway settings (what `toolflash serve` flags set).

Each setting is declared once, here: a field with a `help` in its metadata also becomes a
`toolflash serve` flag (`--max-json-depth` for `max_json_depth`; `toolflash/commands/serve.py`
derives them), and `gateway/SERVER.md` documents them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolflash.engine.api import Mode


def _flag(default: Any, help: str) -> Any:
    """A setting that is also a `toolflash serve` flag (`help` is the flag's help)."""
    return field(default=default, metadata={"help": help})


# Keys the server itself passes to the chat template: a client must never set them through
# chat_template_kwargs (they collided with ours: TypeError/ValueError 500s), nor swap the
# template itself (a client template ran unbounded on the server).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "raise_exception",
        "strftime_now",
    }
)


@dataclass(frozen=True)
class GatewayConfig:
    """Serving settings. `default_max_tokens` caps generations whose request names no limit
    (they otherwise fill the remaining context)."""

    mode: Mode = "spec"
    block_size: int | None = None
    max_queue: int = 16
    api_key: str | None = None
    # A few MB holds a full long-context agent turn (128k tokens of history and tools is
    # ~1-2 MB of JSON); a 15 MB body took 12 s to parse and check before its 400.
    max_body_bytes: int = 4 * 1024 * 1024
    default_max_tokens: int = 8192
    served_model_names: tuple[str, ...] = ()
    # -- input limits (each also a `toolflash serve` flag) -----------------------------------
    max_json_depth: int = _flag(
        64, "deepest nesting of arrays and objects in a request body (400 past it)"
    )
    template_kwargs: tuple[str, ...] = _flag(
        # tool_call_format: the embedded models' template switch (hermes or qwen3_coder).
        ("enable_thinking", "reasoning_effort", "tool_call_format"),
        "chat_template_kwargs keys a client may set, comma-separated (others are a 400)",
    )
    max_template_kwarg_chars: int = _flag(
        1024, "longest string a chat_template_kwargs value may be (400 past it)"
    )
    render_timeout_s: float = _flag(
        5.0, "longest the chat template may take to render and tokenize a prompt (400 past it)"
    )
    render_threads: int = _flag(
        2, "threads that render chat templates and tokenize prompts, off the engine thread"
    )
    stream_interval_ms: float = _flag(
        10.0,
        "least time between two writes of a stream (ms): deltas that arrive meanwhile go out "
        "together, so a fast model is not slowed by a write per token; 0 writes each at once",
    )
