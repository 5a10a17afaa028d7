"""`DFlashEngine`: the `Engine` the gateway drives. Holds the loaded models, the tokenizer and
the prefix cache, renders and tokenizes chat prompts, and runs each request as a `Lane` (the
request loop: session, mode control, stops, text, stats)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import structlog

from toolflash.cache.key import SnapshotKey, template_hash
from toolflash.cache.prefix_cache import PrefixCache

from .api import (
    DEFAULT_DRAFT_LENGTH,
    DraftLength,
    EngineEvent,
    GenerationRequest,
    Mode,
    ModeController,
)
from .draft_context import DraftWindow
from .drafter import DFlashDrafter
from .lane import Lane
from .lookup import LookupConfig
from .session import PREFILL_CHUNK
from .sparse import SparseSelection
from .sparse_scoring import MESSAGE_START, plan_sparse, prompt_layout
from .targets.base import TargetAdapter
from .text import decodes_as_wrapper, fast_backend, max_token_chars

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class EngineOptions:
    """Engine-wide settings (the request may override mode and block size)."""

    mode: Mode = "spec"
    block_size: int | None = None
    draft_length: DraftLength = DEFAULT_DRAFT_LENGTH
    window: DraftWindow = DraftWindow()
    prefill_chunk: int = PREFILL_CHUNK
    context_length: int | None = None
    lookup: LookupConfig = LookupConfig()


class DFlashEngine:
    """One loaded target (+ optional drafter) and its tokenizer."""

    def __init__(
        self,
        target: TargetAdapter,
        tokenizer: Any,
        drafter: DFlashDrafter | None,
        model_id: str,
        draft_id: str | None,
        context_length: int,
        options: EngineOptions | None = None,
        prefix_cache: PrefixCache | None = None,
        generation_defaults: Mapping[str, float] | None = None,
    ):
        self.target = target
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.model_id = model_id
        self.draft_id = draft_id if drafter is not None else None
        self.options = options or EngineOptions()
        self.context_length = self.options.context_length or context_length
        template = getattr(tokenizer, "chat_template", None) or ""
        self.tool_call_format = tool_call_format_of(template)
        self.eos_ids = frozenset(int(t) for t in getattr(tokenizer, "eos_token_ids", ()) or ())
        self.prefix_cache = prefix_cache
        self.vocab_size = int(target.vocab_size)
        self.generation_defaults = dict(generation_defaults or {})
        self.cache_key = SnapshotKey(
            target_id=model_id,
            draft_id=self.draft_id,
            target_layer_ids=drafter.config.target_layer_ids if drafter is not None else (),
            draft_sink=self.options.window.sink if drafter is not None else None,
            draft_window=self.options.window.window if drafter is not None else None,
            template_hash=template_hash(template),
            dtype=str(target.embed(mx.array([[0]])).dtype),
        )
        self._closed = False
        # The fast tokenizer behind the wrapper (None for others: then every text is
        # tokenized through `encode`), its added tokens, and the last chat prompt's encoding.
        self._backend = fast_backend(tokenizer)
        # Decoding through the fast tokenizer itself skips the wrappers (~0.6 us against ~6 us
        # for a few tokens), where it decodes exactly as they do.
        self._decodes_as_wrapper = decodes_as_wrapper(tokenizer, self._backend)
        self._added_ids = (
            frozenset(self._backend.get_added_tokens_decoder())
            if self._backend is not None
            else frozenset()
        )
        # Per thread: the gateway renders and tokenizes on its render threads, several at
        # once, and each reads back its own prompt's encoding in `stable_prefix`.
        self._chats = threading.local()
        # No token spells more characters than this, so a text longer than context_length
        # times it cannot fit the context (refused without tokenizing it).
        self.max_token_chars = max_token_chars(tokenizer)
        # Runs a controller's `prepare` while the prefill computes (MLX releases the GIL
        # while it evaluates); created on first use.
        self._preparer: ThreadPoolExecutor | None = None

    def close(self, timeout: float | None = None) -> None:
        """Release what outlives a request: writes queued for the prefix cache's disk tier
        are finished (at most `timeout` seconds, by default the cache config's
        `l2_close_timeout_s`; what is left is dropped and logged) and its
        writer is joined; publishing afterwards no longer reaches the disk. Idempotent.

        A process that never calls it is covered too: the disk tier, which owns the writer
        thread, registers its own close at interpreter exit (so does a `PrefixCache` used
        without an engine), which is why nothing is registered here."""
        if self._closed:
            return
        self._closed = True
        if self.prefix_cache is not None:
            self.prefix_cache.close(timeout)
        if self._preparer is not None:
            self._preparer.shutdown(wait=True)
            self._preparer = None

    @property
    def _last_chat(self) -> _ChatEncoding | None:
        """This thread's last `encode_chat` prompt."""
        last: _ChatEncoding | None = getattr(self._chats, "last", None)
        return last

    @_last_chat.setter
    def _last_chat(self, value: _ChatEncoding | None) -> None:
        self._chats.last = value

    @property
    def default_block_size(self) -> int:
        if self.options.block_size:
            return self.options.block_size
        if self.drafter is not None:
            return self.drafter.config.block_size
        return self.options.lookup.block_size  # only lookup cycles draft without a drafter

    # -- tokenization --------------------------------------------------------------------
    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        generation_prompt: bool,
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=generation_prompt,
                tokenize=False,
                **dict(template_kwargs or {}),
            )
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        text = self._render(messages, tools, template_kwargs, True)
        if self._backend is None:
            return self.encode(text)
        # The same ids as `encode` (same tokenizer, no special tokens added), plus each
        # token's character span, kept for `stable_prefix` of this prompt.
        encoding = self._backend.encode(text, add_special_tokens=False)
        ids = list(encoding.ids)
        self._last_chat = _ChatEncoding(text, ids, encoding)
        return ids

    def stable_prefix(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        prompt: Sequence[int],
    ) -> int:
        """Length of the part of `prompt` that the next agent turn will resend unchanged: the
        rendered messages without the generation header. 0 when that rendering is not a token
        prefix of `prompt` (then nothing is published at the boundary).

        Rendering is cheap (~1 ms at 10k tokens); tokenizing is not (~10 ms). So when `prompt`
        is the last `encode_chat` result, the prefix's tokens are read off that tokenization
        (`_prefix_from_offsets`) instead of tokenizing the prefix text again."""
        text = self._render(messages, tools, template_kwargs, False)
        n = self._prefix_from_offsets(text, prompt)
        if n is None:  # no tokenization to reuse, or a boundary where reuse is not exact
            ids = self.encode(text)
            n = len(ids) if list(prompt[: len(ids)]) == ids else 0
        return n if 0 < n < len(prompt) else 0

    def _prefix_from_offsets(self, prefix_text: str, prompt: Sequence[int]) -> int | None:
        """How many tokens of the last `encode_chat` prompt encode `prefix_text`, when that
        count is exact without tokenizing `prefix_text`; None otherwise.

        Exact when the full text starts with `prefix_text` and an added token (`<|im_start|>`)
        begins right at its end: a fast tokenizer splits added tokens out first and then
        normalizes, pre-tokenizes and merges each piece between them on its own, so no BPE
        merge crosses that boundary and `encode(prefix_text)` is the full encoding's first n
        tokens. Anywhere else (the boundary inside a piece, where merges could cross it) the
        caller tokenizes the prefix text as before."""
        last = self._last_chat
        if last is None or len(prompt) != len(last.ids) or not last.text.startswith(prefix_text):
            return None
        if list(prompt) != last.ids:
            return None
        end = len(prefix_text)
        offsets = last.encoding.offsets
        n = len(offsets)
        while n > 0 and offsets[n - 1][0] >= end:  # the header is a few tokens: scan back
            n -= 1
        if n >= len(offsets) or offsets[n][0] != end or last.ids[n] not in self._added_ids:
            return None
        if n > 0 and offsets[n - 1][1] > end:
            return None
        return n

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        if self._decodes_as_wrapper:  # the streamed text is decoded twice per step
            return str(self._backend.decode(list(token_ids), skip_special_tokens=False))
        return str(self.tokenizer.decode(list(token_ids)))

    # -- generation ----------------------------------------------------------------------
    def generate(
        self,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        controller: ModeController | None = None,
    ) -> Iterator[EngineEvent]:
        """Prefill (reusing the longest cached prefix), then decode, as events: the prefill's
        token, one event per cycle or AR step, a final `FinishEvent` with the stats. The
        request's lane run alone (`Lane`: the same loop the batch scheduler interleaves)."""
        lane = Lane(self, request, cancel, controller)
        try:
            while not lane.prefilled and not lane.done:
                yield from lane.prefill_step()
            while not lane.done:
                yield from lane.solo_step()
        finally:  # also when the consumer stops early (closing the generator)
            lane.release()

    def sparse_selection(
        self, request: GenerationRequest, prompt: list[int], restored: int
    ) -> SparseSelection | None:
        """The chunks a request's opt-in sparse prefill computes (None: dense prefill)."""
        settings = request.sparse_prefill
        if settings is None or len(prompt) - restored < settings.min_tokens:
            return None
        layout = prompt_layout(prompt, self._message_start_id, self.decode)
        return plan_sparse(settings, prompt, layout, self.target.embed, restored)

    @functools.cached_property
    def _message_start_id(self) -> int | None:
        """The chat template's message start token (`<|im_start|>`), None if it has none."""
        ids = self.encode(MESSAGE_START)
        return ids[0] if len(ids) == 1 and ids[0] in self._added_ids else None

    def submit(self, fn: Callable[..., None], *args: Any) -> Future[None]:
        """Run `fn` on the preparer thread (one at a time, in order: a request's reads never
        overlap the previous request's)."""
        if self._preparer is None:
            self._preparer = ThreadPoolExecutor(1, thread_name_prefix="toolflash-prepare")
        return self._preparer.submit(fn, *args)


@dataclass(frozen=True)
class _ChatEncoding:
    """The last rendered chat prompt, its ids and the tokenizer's encoding (character spans)."""

    text: str
    ids: list[int]
    encoding: Any  # tokenizers.Encoding


def tool_call_format_of(template: str) -> str:
    """The tool-call markup the chat template renders by default: Qwen3-Coder XML templates
    write `<function=...>` and no JSON `"name"`; hermes templates write JSON (templates
    that can do both, like the tiny zoo's, default to hermes)."""
    if "<function=" in template and '"name"' not in template:
        return "qwen3_coder"
    return "hermes"
