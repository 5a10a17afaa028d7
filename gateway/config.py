"""Gateway settings, each declared once: `toolflash serve` derives one flag per field (its name
dashed, or the `flag` named in its extra data; `scale` converts the flag's unit to the field's),
with its type, default, choices and help, and the settings reference (SETTINGS.md) renders the
same declarations."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from toolflash.engine.api import Mode
from toolflash.engine.sparse import SPARSE_MIN_TOKENS

MB = 1 << 20

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


class GatewayConfig(BaseModel):
    """Serving settings (the HTTP side; the engine's are the cache's and `toolflash serve`'s)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = Field(
        default="spec",
        description="decoding mode with --policy off: spec, ar or lookup (the adaptive policy"
        " chooses per request class and span itself)",
    )
    block_size: int | None = Field(
        default=None,
        ge=2,
        description="largest speculative block (unset: the drafter's own block size)",
    )
    max_queue: int = Field(
        default=16, ge=1, description="requests that may wait for the engine (429 past it)"
    )
    max_batch: int | None = Field(
        default=None,
        ge=1,
        description="requests decoded together in one continuous batch (the rest queue;"
        " unset: 4 per CPU core within 2..16; 1: one request at a time)",
    )
    prefill_thread: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="compute a newcomer's prompt chunks on a thread of their own while the batch"
        " decodes (auto: on a CPU with four or more cores, not on a GPU; the running streams keep"
        " decoding, the newcomer's TTFT may grow where the cores are busy)",
    )
    batch_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        description="memory for the batch's caches: each running request reserves its prompt"
        " + max_tokens of K/V and its recurrent state, and waits (or gets a 429 if it could"
        " never fit) past it (MB on the command line; unset: half the GPU's memory, on a CPU"
        " the machine's, less the weights)",
        json_schema_extra={"flag": "batch-memory-mb", "scale": MB},
    )
    api_key: str | None = Field(
        default=None,
        description="require 'Authorization: Bearer KEY'; mandatory when --host is not a"
        " loopback address",
        json_schema_extra={"env": "TOOLFLASH_API_KEY"},
    )
    # A few MB holds a full long-context agent turn (128k tokens of history and tools is
    # ~1-2 MB of JSON); a 15 MB body took 12 s to parse and check before its 400.
    max_body_bytes: int = Field(
        default=4 * MB,
        ge=1,
        description="request body limit, 413 past it (MB on the command line)",
        json_schema_extra={"flag": "max-body-mb", "scale": MB},
    )
    default_max_tokens: int = Field(
        default=8192,
        ge=1,
        description="output limit of a request that names none: the context left after the"
        " prompt, capped at this (a request's own max_tokens is clamped to the context left)",
    )
    served_model_names: tuple[str, ...] = Field(
        default=(),
        description="extra names clients may use for the model (repeatable, comma-separated)",
        json_schema_extra={"flag": "served-model-name"},
    )
    # -- input limits ------------------------------------------------------------------------
    max_json_depth: int = Field(
        default=64,
        ge=1,
        description="deepest nesting of arrays and objects in a request body (400 past it)",
    )
    template_kwargs: tuple[str, ...] = Field(
        # tool_call_format: the embedded models' template switch (hermes or qwen3_coder).
        default=("enable_thinking", "reasoning_effort", "tool_call_format"),
        description="chat_template_kwargs keys a client may set, comma-separated (others are a"
        " 400)",
    )
    max_template_kwarg_chars: int = Field(
        default=1024,
        ge=1,
        description="longest string a chat_template_kwargs value may be (400 past it)",
    )
    render_timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        description="longest the chat template may take to render and tokenize a prompt (400"
        " past it)",
    )
    render_threads: int = Field(
        default=2,
        ge=1,
        description="threads that render chat templates and tokenize prompts, off the engine"
        " thread",
    )
    stream_interval_ms: float = Field(
        default=0.0,
        ge=0.0,
        description="least time between two writes of a stream (ms; 0: every token goes out as"
        " soon as it is ready, with the others ready at that moment): deltas that arrive"
        " meanwhile go out together, fewer writes for tokens held back",
    )
    loop_nice: int | None = Field(
        default=None,
        ge=0,
        le=19,
        description="run the event loop thread this many nice steps below the engine's threads"
        " (Linux, where nice is per thread; 0: off; unset: 10 where a local engine runs on"
        " MLX's CPU with at most 2 usable cores, else 0): where a CPU engine fills the cores, a"
        " stream's per-token work then waits for a free core instead of taking the engine's"
        " (2 cores, greedy AR: streams decode ~4 percent faster, each token out ~0.5 ms later)",
    )
    sparse_prefill: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="opt-in positional sparse prefill of long prompts for every request: compute"
        " about this share of the prompt's chunks (unset: off; a policy file's class setting or"
        " the request's sparse_prefill field takes precedence; quality: SERVER.md)",
    )
    sparse_min_tokens: int = Field(
        default=SPARSE_MIN_TOKENS,
        ge=0,
        description="a sparse prefill applies only when at least this many prompt tokens are left"
        " to compute after the prefix cache",
    )
