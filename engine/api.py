"""The engine's contract with its callers: frozen request/event types and the `Engine` protocol.

This module must not import `mlx`: the gateway's protocol layer imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .sparse import SparsePrefill

# "spec": DFlash cycles (the drafter's block, verified by the target); "ar": one target step per
# token; "lookup": cycles whose draft is the continuation of an earlier occurrence of the output's
# suffix in the prompt + output (engine/lookup.py), an AR step where there is none.
Mode = Literal["spec", "ar", "lookup"]
# Whether a speculative cycle may draft less than the block (engine/draft_length.py).
DraftLength = Literal["adaptive", "fixed"]
# The engine's and `toolflash serve`'s default (engine/draft_length.py).
DEFAULT_DRAFT_LENGTH: DraftLength = "adaptive"
FinishReason = Literal["stop", "length", "cancelled"]


class EngineError(Exception):
    """Base class for errors the engine reports to callers."""


class ContextLengthError(EngineError):
    """The prompt (plus the requested output) does not fit the model's context."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context_length: int) -> None:
        super().__init__(
            f"This model's maximum context length is {context_length} tokens. "
            f"The request has {prompt_tokens} prompt tokens"
            + (f" and asks for {max_tokens} output tokens." if max_tokens else ".")
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn from the target's distribution. `temperature` 0 is greedy (the
    default); the other fields shape the distribution or the logits before selection and
    apply identically in AR and speculative mode."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class ToolSpec:
    """A tool an output constraint may call: its name, JSON-schema `parameters` (None: any
    object) and whether its arguments must validate against them (`strict`)."""

    name: str
    parameters: Mapping[str, Any] | None = None
    strict: bool = False


ConstraintKind = Literal["json", "tool_calls"]
# How a constraint treats a leading `<think>` block: "none" constrains from the first token
# (thinking off or already closed in the prompt), "optional" lets the model open and close one
# first (free text), "open" means the prompt ended inside `<think>` (free text up to `</think>`).
ReasoningMode = Literal["none", "optional", "open"]


@dataclass(frozen=True)
class OutputConstraint:
    """A grammar the output must follow (enforced by masking the target's logits in both modes).

    `json`: one JSON value valid against `schema` (None: any JSON object); `strict` False
    ignores schema keywords the grammar engine cannot enforce instead of refusing them.
    `tool_calls`: `require_call` True (tool_choice "required" or named) forces one call, or
    several when `parallel_calls`, to one of `tools` in `tool_format` ("hermes" or
    "qwen3_coder"); False (tool_choice "auto") leaves text free and only makes calls
    well-formed, with the arguments of `strict` tools valid against their schema."""

    kind: ConstraintKind
    schema: Mapping[str, Any] | None = None
    strict: bool = True
    tools: tuple[ToolSpec, ...] = ()
    require_call: bool = True
    parallel_calls: bool = True
    tool_format: str = "hermes"
    reasoning: ReasoningMode = "none"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation, already tokenized.

    `mode` is the mode to start in; `mode_plan` (cycle index -> mode) lets callers and tests
    script switches at cycle boundaries. Stop strings end generation at the token that
    completes them; the text of the stop string itself is never returned.
    """

    prompt_tokens: tuple[int, ...]
    max_tokens: int
    mode: Mode = "spec"
    # The largest block (a policy's decisions replace it); `draft_length` says whether cycles
    # may draft less (None: the engine's default), under a policy too.
    block_size: int | None = None
    draft_length: DraftLength | None = None
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    # Generate through the model's EOS tokens (fixed-length benchmarks; vLLM's `ignore_eos`).
    ignore_eos: bool = False
    sampling: SamplingParams = SamplingParams()
    mode_plan: Mapping[int, Mode] = field(default_factory=dict)
    request_id: str = ""
    # Prompt positions where the prefix cache should publish a snapshot (e.g. the end of
    # system + tools + history, before the generation header).
    publish_at: tuple[int, ...] = ()
    # A grammar the output must follow (response_format, forced or strict tool calls).
    constraint: OutputConstraint | None = None
    # Log-probabilities of the emitted tokens: None off, n >= 0 with the n most likely
    # alternatives at each position (the target's raw distribution, see TokenLogprob).
    logprobs: int | None = None
    # Opt-in positional sparse prefill (None: dense): compute only about `keep` of a long
    # prompt's chunks, at their true positions; never reused as a dense state (engine/sparse.py).
    sparse_prefill: SparsePrefill | None = None


@dataclass(frozen=True)
class CycleRecord:
    """What one decode cycle did. An AR step is a cycle of block size 1 that drafted nothing.

    `forced`: how many tokens of this cycle an output constraint forced. In spec mode they are
    the cycle's `drafted` tokens (the drafter did not run; the grammar-fixed stretch was verified
    in one forward, so `block_size` is the run length + 1, usually shorter than the block the
    caller asked for). In AR mode a jump-forward step feeds the staged token plus the forced run
    in one forward (`block_size` = run + 1, `drafted` = `accepted` = 0). 0 for drafted cycles
    and one-token AR steps. `draft_cut`: a drafted proposal the constraint
    ended before the block was full (the grammar allowed nothing further, e.g. after a closed
    call), so `block_size` is smaller than asked although the block was not limited.

    Spec phases overlap (one host synchronisation per cycle): `draft_s` is the host's time to
    build and queue the draft and the verify forward (the drafter computes meanwhile);
    `verify_s` the wait for the verdict (the rest of the draft, the verify forward and the
    acceptance); `rollback_s` the commit. Their sum is the cycle; the split between the two
    forwards is measured apart (`toolflash bench --baseline mlx-lm`, phase split)."""

    index: int
    mode: Mode
    block_size: int
    drafted: int
    accepted: int
    committed: int
    draft_s: float
    verify_s: float
    rollback_s: float
    context_len: int
    forced: int = 0
    draft_cut: bool = False
    # Sequences in the forward this step ran in: 1 alone, more in a batched AR step (the
    # continuous batch, engine/batching/), whose cost is the whole batch's.
    rows: int = 1

    @property
    def total_s(self) -> float:
        return self.draft_s + self.verify_s + self.rollback_s

    @property
    def speculative(self) -> bool:
        """A drafted (or grammar-forced) block verified in spec or lookup mode: not an AR step,
        nor a lookup step that found no match."""
        return self.mode != "ar" and self.block_size > 1


@dataclass(frozen=True)
class TopLogprob:
    """One candidate token at an output position and its log-probability."""

    token_id: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target's raw distribution (its logits
    before temperature, penalties, bias, top-k/top-p/min-p and grammar masks), with the most
    likely alternatives; the same in AR and speculative mode up to float rounding."""

    token_id: int
    text: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    """Newly committed tokens and the text they complete (may be empty while a multi-byte
    character or a possible stop string is pending)."""

    token_ids: tuple[int, ...]
    text: str
    cycle: CycleRecord | None = None
    # One entry per emitted token of token_ids (EOS excluded) when the request asked.
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ConstraintStats:
    """What the output constraint (grammar masks) did over one generation. Forced runs are
    grammar-fixed stretches verified without drafting them; `drafted` counts only drafted
    tokens the grammar checked, `grammar_rejected` those at or after the first it forbade."""

    mask_rows: int = 0  # mask rows computed (AR steps and verify rows)
    mask_s: float = 0.0  # computing and applying masks (grammar walks included)
    drafted: int = 0
    grammar_rejected: int = 0
    grammar_cuts: int = 0  # drafts the grammar cut short
    forced_runs: int = 0
    forced_tokens: int = 0

    def __add__(self, other: ConstraintStats) -> ConstraintStats:
        return ConstraintStats(
            self.mask_rows + other.mask_rows,
            self.mask_s + other.mask_s,
            self.drafted + other.drafted,
            self.grammar_rejected + other.grammar_rejected,
            self.grammar_cuts + other.grammar_cuts,
            self.forced_runs + other.forced_runs,
            self.forced_tokens + other.forced_tokens,
        )

    @property
    def rejected_share(self) -> float:
        return self.grammar_rejected / self.drafted if self.drafted else 0.0

    @property
    def mask_us_per_row(self) -> float:
        return 1e6 * self.mask_s / self.mask_rows if self.mask_rows else 0.0


@dataclass(frozen=True)
class GenerationStats:
    """Totals for one finished generation (`constraint`: None without an output constraint)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    prefill_s: float
    decode_s: float
    cycles: tuple[CycleRecord, ...]
    constraint: ConstraintStats | None = None
    # Prompt tokens the prefill computed (restored and dropped ones excluded), and whether it
    # ran sparse (some prompt chunks never computed: `GenerationRequest.sparse_prefill`).
    computed_tokens: int = 0
    sparse: bool = False

    @property
    def modes(self) -> tuple[Mode, ...]:
        seen: list[Mode] = []
        for c in self.cycles:
            if c.mode not in seen:
                seen.append(c.mode)
        return tuple(seen)

    @property
    def spec_cycles(self) -> int:
        """Speculative cycles: a drafter's or lookup's block verified (not AR steps, nor lookup
        steps that found no match)."""
        return sum(1 for c in self.cycles if c.speculative)

    @property
    def drafted(self) -> int:
        return sum(c.drafted for c in self.cycles)

    @property
    def accepted(self) -> int:
        return sum(c.accepted for c in self.cycles)

    @property
    def tokens_per_cycle(self) -> float:
        """Committed tokens per speculative cycle (tau); 0.0 when no spec cycle ran."""
        spec = [c for c in self.cycles if c.speculative]
        if not spec:
            return 0.0
        return sum(c.committed for c in spec) / len(spec)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.completion_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def batch_band(self) -> str:
        """The band of the largest batch its decode steps ran in (`batch_band`)."""
        return batch_band(max((c.rows for c in self.cycles), default=1))


def batch_band(rows: int) -> str:
    """A batch size as a band: "1" (alone), "2-3", "4-7", "8-15", "16+"."""
    if rows <= 1:
        return "1"
    low = 1 << (rows.bit_length() - 1)
    return "16+" if low >= 16 else f"{low}-{2 * low - 1}"


@dataclass(frozen=True)
class FinishEvent:
    """The last event of every generation."""

    finish_reason: FinishReason
    stats: GenerationStats


EngineEvent = TokenEvent | FinishEvent


@dataclass(frozen=True)
class ModeDecision:
    """What the next cycle does: `mode` with `block_size` (ignored for `ar`)."""

    mode: Mode
    block_size: int
    reason: str = ""


class ModeController(Protocol):
    """Chooses the mode between cycles (the adaptive policy implements this). The engine calls
    `prepare` on another thread while the prefill computes (reads the start decision needs,
    made off the decode path), `observe_prefix` with the text of the token the prefill chose,
    `start` after it, `after_step` after every cycle or AR step with what it committed, and
    `finish` once with the totals, after the `FinishEvent` is out. `default_block_size` is the
    drafter's block (0: no drafter, so no spec), `lookup_block` the engine's lookup block (0:
    no lookup)."""

    def prepare(
        self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0
    ) -> None: ...

    def observe_prefix(self, text: str) -> None: ...

    def start(
        self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0
    ) -> ModeDecision: ...

    def after_step(
        self, record: CycleRecord, token_ids: Sequence[int], text: str
    ) -> ModeDecision: ...

    def finish(self, stats: GenerationStats) -> None: ...


class Engine(Protocol):
    """What the gateway needs from an engine. `generate` runs on the engine's worker thread;
    `encode`, `decode`, `encode_chat` and `stable_prefix` also run on the gateway's render
    threads, several at once (they keep no state across threads: `stable_prefix` reads the
    same thread's last `encode_chat`)."""

    model_id: str
    draft_id: str | None
    context_length: int
    tool_call_format: str  # "hermes" or "qwen3_coder": what the chat template renders
    vocab_size: int  # logits per position (token ids below it are valid for logit_bias)
    max_token_chars: int  # the most characters one token spells (prompt size checks)
    # Sampling defaults from the model's generation_config.json (temperature only when it
    # sets do_sample); the gateway applies them where a request leaves a field out.
    generation_defaults: Mapping[str, float]

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Render messages (and tools) with the model's chat template, with the generation
        prompt appended, and tokenize."""
        ...

    def stable_prefix(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        prompt: Sequence[int],
    ) -> int:
        """Tokens of `prompt` before the generation header (0 if not a clean prefix): where
        the prefix cache publishes so the next agent turn hits."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def generate(
        self,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        controller: ModeController | None = None,
    ) -> Iterator[EngineEvent]:
        """Run one generation. Yields TokenEvents, then exactly one FinishEvent. Setting
        `cancel` ends the generation within one cycle with finish_reason "cancelled". A
        `controller` picks the mode and block size between cycles (request.mode_plan
        entries still take precedence, for tests)."""
        ...
