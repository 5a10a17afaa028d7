"""The agent workload's requests through the server's own request path, and one timed run of a
request under a strategy (a fixed decoding mode, the adaptive policy, or plain mlx-lm).

A turn's body goes the way a `POST /v1/chat/completions` goes: `ChatCompletionRequest`
validation and the chat checks, the dialect-neutral `ApiRequest`, `render_prompt` (chat template,
output constraint, stable prefix) and the worker-side `preparer` (budget, sampling, request
class, the policy's controller). The engine's public `generate` then runs it, one request at a
time (a lone request is what the benchmark measures; the server's batcher runs a lone request
the same way).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agent_workload_data import DATA_DIR, Session, load_sessions, turn_bodies

from toolflash.engine.api import Engine, FinishEvent, GenerationStats
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.dialects.openai_request import chat_request
from toolflash.gateway.prepare import ControllerFactory, ControllerRequest, preparer
from toolflash.gateway.prompt import Prompt, render_prompt
from toolflash.gateway.protocol import ChatCompletionRequest
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.validation import check_chat_supported
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.request_class import RequestClass

# Strategies that run one decoding mode for the whole request, as `toolflash serve --policy off`
# would (lookup is not a server mode: its requests are the prepared request in lookup mode).
FIXED_MODES = {"ar": "ar", "ar-again": "ar", "spec": "spec", "lookup": "lookup"}
BASELINE = "mlx-lm"


@dataclass(frozen=True)
class WorkItem:
    """One request of the workload, rendered as the server renders it."""

    session: str
    turn: int
    api: ApiRequest
    rendered: Prompt
    request_class: RequestClass

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.rendered.tokens


def build_workload(
    engine: Engine,
    max_tokens: int = 96,
    sessions: Sequence[Session] | None = None,
) -> list[WorkItem]:
    """Every assistant turn of `sessions` (default: all of the data files) as a request."""
    config = GatewayConfig()
    items = []
    for session in load_sessions(DATA_DIR) if sessions is None else sessions:
        for turn in turn_bodies(session, engine.model_id, max_tokens):
            wire = ChatCompletionRequest.model_validate(turn.body)
            check_chat_supported(wire, config, engine.context_length)
            api = chat_request(wire)
            prompt = render_prompt(api, engine)
            prepared = preparer(api, prompt, config, "class")(engine)
            items.append(WorkItem(turn.session, turn.turn, api, prompt, prepared.request_class))
    return items


def class_name(cls: RequestClass) -> str:
    """Reporting group: the label without its length band (every prompt here is short)."""
    return cls.label.rsplit(".", 1)[0]


def controller_factory(policy: AdaptivePolicy) -> ControllerFactory:
    """The server's hook into the policy (`toolflash serve` builds the same one)."""

    def factory(r: ControllerRequest) -> Any:
        return policy.controller_for(
            r.model_id,
            r.request_class,
            r.response_format_json,
            start_in_reasoning=r.start_in_reasoning,
        )

    return factory


@dataclass(frozen=True)
class Result:
    """One run: its tokens, decode timing and what its steps did. `decode_s` and `cpu_s` run
    from the first token's arrival to the last's (wall and process CPU time), measured the same
    way for the engine and for mlx-lm (as `toolflash bench --baseline mlx-lm` does), over
    `decode_tokens` (the tokens after the first)."""

    tokens: list[int]
    decode_s: float
    cpu_s: float
    completion_tokens: int
    cycles: int = 0
    spec_cycles: int = 0  # speculative blocks verified (drafter's or lookup's)
    forced_cycles: int = 0
    forced_tokens: int = 0
    lookup_steps: int = 0  # steps run in lookup mode (a match verified, or an AR step)
    lookup_hits: int = 0  # ... of which a match was drafted and verified
    lookup_drafted: int = 0
    lookup_accepted: int = 0
    arm_steps: dict[str, int] = dataclasses.field(default_factory=dict)
    summary: dict[str, Any] | None = None

    @property
    def decode_tokens(self) -> int:
        return max(len(self.tokens) - 1, 0)


def timed(chunks: Iterable[Sequence[int]]) -> tuple[list[int], float, float]:
    """Tokens of `chunks`, and the wall and CPU time from the first chunk's arrival to the
    last's."""
    tokens: list[int] = []
    wall0 = wall1 = cpu0 = cpu1 = 0.0
    for chunk in chunks:
        if not chunk:
            continue
        wall1, cpu1 = time.perf_counter(), time.process_time()
        if not tokens:
            wall0, cpu0 = wall1, cpu1
        tokens.extend(chunk)
    return tokens, wall1 - wall0, cpu1 - cpu0


def generate(
    engine: Any,
    item: WorkItem,
    strategy: str,
    max_tokens: int,
    policy: AdaptivePolicy | None = None,
) -> Result:
    """Run `item` once: under `policy` when one is given (the server with its adaptive policy),
    else in the fixed mode `strategy` names, or plain mlx-lm for `mlx-lm`."""
    if strategy == BASELINE:
        return mlx_lm_generate(engine, item.prompt, max_tokens)
    if policy is None and strategy not in FIXED_MODES:
        raise ValueError(f"strategy {strategy!r} needs a policy (fixed modes: {FIXED_MODES})")
    mode = FIXED_MODES.get(strategy, "spec") if policy is None else "spec"
    config = GatewayConfig(mode="ar" if mode == "ar" else "spec")
    factory = controller_factory(policy) if policy is not None else None
    prepared = preparer(item.api, item.rendered, config, f"{strategy}-{item.session}", factory)(
        engine
    )
    request = dataclasses.replace(prepared.request, max_tokens=max_tokens)
    if mode == "lookup":
        # Lookup drafts its own block (the drafter's is for the drafter).
        request = dataclasses.replace(
            request, mode="lookup", block_size=engine.options.lookup.block_size
        )
    controller = prepared.decision_log
    stats: list[GenerationStats] = []
    options = engine.options
    if strategy == "policy-2arm":
        # The policy before the lookup arm: no lookup anywhere, spec cycles' takeover included.
        lookup = dataclasses.replace(options.lookup, spec_takeover=False)
        engine.options = dataclasses.replace(options, lookup=lookup)

    def chunks() -> Iterator[Sequence[int]]:
        for event in engine.generate(request, None, controller):
            if isinstance(event, FinishEvent):
                stats.append(event.stats)
            else:
                yield event.token_ids

    try:
        tokens, wall, cpu = timed(chunks())
    finally:
        engine.options = options
    summary = getattr(controller, "summary", None)
    return from_stats(tokens, wall, cpu, stats[0], summary() if summary else None)


def from_stats(
    tokens: list[int],
    wall: float,
    cpu: float,
    st: GenerationStats,
    summary: dict[str, Any] | None,
) -> Result:
    lookup = [c for c in st.cycles if c.mode == "lookup"]
    # A lookup step that verified a match (a grammar-forced run is the constraint's, not lookup's).
    hits = [c for c in lookup if c.drafted > 0 and not c.forced]
    return Result(
        tokens,
        wall,
        cpu,
        st.completion_tokens,
        cycles=len(st.cycles),
        spec_cycles=sum(1 for c in st.cycles if c.speculative),
        forced_cycles=sum(1 for c in st.cycles if c.forced),
        forced_tokens=sum(c.forced for c in st.cycles),
        lookup_steps=len(lookup),
        lookup_hits=len(hits),
        lookup_drafted=sum(c.drafted for c in hits),
        lookup_accepted=sum(c.accepted for c in hits),
        arm_steps=dict(Counter(c.mode for c in st.cycles)),
        summary=summary,
    )


def mlx_lm_generate(engine: Any, prompt: Sequence[int], max_tokens: int) -> Result:
    """Plain mlx-lm greedy AR (`mlx_lm.generate.generate_step`, what `mlx_lm.server` runs) on
    the engine's target model and the same token ids, stopping at the first EOS (kept, as the
    engine keeps it), as `toolflash.baseline_bench.mlx_lm_run` runs it. It knows no output
    constraint: on forced tool calls and JSON answers its output may differ from the engine's."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    eos = engine.eos_ids

    def chunks() -> Iterator[list[int]]:
        steps = generate_step(mx.array(list(prompt)), engine.target.model, max_tokens=max_tokens)
        for token, _ in steps:
            yield [int(token)]
            if int(token) in eos:
                break

    tokens, wall, cpu = timed(chunks())
    return Result(tokens, wall, cpu, len(tokens))
