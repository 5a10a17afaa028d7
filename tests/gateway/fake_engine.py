"""A deterministic engine for gateway tests: characters are tokens, outputs are scripted.

The output for a chat is decided by the last message: content `SCRIPT:<text>` makes the model
say exactly `<text>`; a tool message gets `Tool said: <content>`; anything else gets
`Hello! You said: <content>`. Spec cycles commit 1..block_size tokens in a fixed pattern, so
the toolflash object has real numbers to check.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolflash.engine.api import (
    ContextLengthError,
    CycleRecord,
    EngineError,
    EngineEvent,
    FinishEvent,
    GenerationRequest,
    GenerationStats,
    ModeController,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def stop_holdback(text: str, stops: Sequence[str]) -> int:
    """Chars at the end of `text` that may still become a stop string."""
    keep = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if s.startswith(text[-n:]):
                keep = max(keep, n)
                break
    return keep


def fake_logprobs(tokens: Sequence[int], request: GenerationRequest) -> tuple[TokenLogprob, ...]:
    """Scripted log-probabilities: -0.1 per token, alternatives '?' then the next chars."""
    if request.logprobs is None:
        return ()
    return tuple(
        TokenLogprob(
            t,
            chr(t),
            -0.1,
            tuple(
                TopLogprob(a, chr(a), -0.1 - i)
                for i, a in enumerate([t, ord("?"), t + 1][: request.logprobs])
            ),
        )
        for t in tokens
    )


@dataclass
class FakeEngine:
    model_id: str = "fake-model"
    draft_id: str | None = "fake-draft"
    context_length: int = 4096
    tool_call_format: str = "hermes"
    block_size: int = 4
    cycle_delay_s: float = 0.0
    fail_after_tokens: int | None = None
    think_in_prompt: bool = False
    cached_tokens: int = 0
    vocab_size: int = 0x110000  # characters are tokens
    max_token_chars: int = 1
    generation_defaults: dict[str, float] = field(default_factory=dict)
    # Observations for tests.
    last_chat: tuple[Any, Any, Any] | None = None
    last_request: GenerationRequest | None = None
    finishes: list[str] = field(default_factory=list)
    active: threading.Event = field(default_factory=threading.Event)
    threads: set[str] = field(default_factory=set)  # where generate ran
    encode_threads: set[str] = field(default_factory=set)  # where chat templates rendered

    # -- tokenizer ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        self.encode_threads.add(threading.current_thread().name)
        self.last_chat = (list(messages), tools, dict(template_kwargs or {}))
        text = ""
        if tools:
            text += f"{IM_START}system\n# Tools\n{json.dumps(list(tools))}{IM_END}\n"
        for m in messages:
            body = m.get("content") or ""
            for call in m.get("tool_calls") or []:
                body += "\n<tool_call>\n" + json.dumps(call["function"]) + "\n</tool_call>"
            text += f"{IM_START}{m['role']}\n{body}{IM_END}\n"
        text += f"{IM_START}assistant\n"
        if (template_kwargs or {}).get("enable_thinking") and self.think_in_prompt:
            text += "<think>\n"
        return self.encode(text)

    def stable_prefix(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        prompt: Sequence[int],
    ) -> int:
        """Everything before the final generation header (this fake's template appends it)."""
        header = self.encode(f"{IM_START}assistant\n")
        n = len(prompt) - len(header)
        return n if n > 0 and list(prompt[n:]) == header else 0

    # -- scripted model ----------------------------------------------------------------
    def respond(self, prompt: str) -> str:
        if IM_END not in prompt:  # raw completion prompt
            if "SCRIPT:" in prompt:
                return prompt.split("SCRIPT:", 1)[1]
            return f" and then {prompt[-12:]!r} continued."
        last = prompt[: prompt.rindex(IM_END)]
        block = last[last.rindex(IM_START) + len(IM_START) :]
        role, _, content = block.partition("\n")
        if content.startswith("SCRIPT:"):
            return content[len("SCRIPT:") :]
        if role == "tool":
            return f"Tool said: {content}"
        return f"Hello! You said: {content[:40]}"

    def generate(
        self,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        controller: ModeController | None = None,
    ) -> Iterator[EngineEvent]:
        self.threads.add(threading.current_thread().name)
        self.last_request = request
        prompt = self.decode(request.prompt_tokens)
        if not request.prompt_tokens or len(request.prompt_tokens) >= self.context_length:
            raise ContextLengthError(
                len(request.prompt_tokens), request.max_tokens, self.context_length
            )
        target = self.encode(self.respond(prompt))
        self.active.set()
        try:
            yield from self._cycles(request, target, cancel, controller)
        finally:
            self.active.clear()

    def _cycles(
        self,
        request: GenerationRequest,
        target: list[int],
        cancel: threading.Event | None,
        controller: ModeController | None,
    ) -> Iterator[EngineEvent]:
        t0 = time.perf_counter()
        stops = request.stop_strings
        committed: list[int] = []
        sent = 0  # chars of text already emitted
        cycles: list[CycleRecord] = []
        mode = request.mode
        reason = "stop"
        block = request.block_size or self.block_size
        if controller is not None:
            decision = controller.start(len(request.prompt_tokens), block)
            mode, block = decision.mode, decision.block_size
        i = 0
        while True:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            if len(committed) >= len(target):
                reason = "stop"
                break
            if len(committed) >= request.max_tokens:
                reason = "length"
                break
            mode = request.mode_plan.get(i, mode)
            want = 1 if mode == "ar" else 1 + (i * 3) % block
            n = min(want, len(target) - len(committed), request.max_tokens - len(committed))
            new = target[len(committed) : len(committed) + n]
            committed += new
            if self.fail_after_tokens is not None and len(committed) >= self.fail_after_tokens:
                raise EngineError("scripted engine failure")
            if self.cycle_delay_s:
                time.sleep(self.cycle_delay_s)
            drafted = 0 if mode == "ar" else block - 1
            rec = CycleRecord(
                index=i,
                mode=mode,
                block_size=1 if mode == "ar" else block,
                drafted=drafted,
                accepted=0 if mode == "ar" else n - 1,
                committed=n,
                draft_s=0.0,
                verify_s=0.001,
                rollback_s=0.0,
                context_len=len(request.prompt_tokens) + len(committed),
            )
            cycles.append(rec)
            i += 1
            text = self.decode(committed)
            hit = min((text.find(s) for s in stops if s in text), default=-1)
            if hit >= 0:
                yield TokenEvent(tuple(new), text[sent:hit], rec, fake_logprobs(new, request))
                reason = "stop"
                break
            safe = len(text) - stop_holdback(text, stops)
            yield TokenEvent(tuple(new), text[sent:safe], rec, fake_logprobs(new, request))
            if controller is not None:
                decision = controller.after_step(rec, new, text[sent:safe])
                mode, block = decision.mode, decision.block_size
            sent = max(sent, safe)
        if reason != "cancelled" and not any(s in self.decode(committed) for s in stops):
            tail = self.decode(committed)[sent:]
            if tail:
                yield TokenEvent((), tail, None)
        self.finishes.append(reason)
        elapsed = time.perf_counter() - t0
        stats = GenerationStats(
            prompt_tokens=len(request.prompt_tokens),
            cached_tokens=self.cached_tokens,
            completion_tokens=len(committed),
            prefill_s=0.001,
            decode_s=max(elapsed, 1e-6),
            cycles=tuple(cycles),
        )
        if controller is not None:
            controller.finish(stats)
        yield FinishEvent(reason, stats)
