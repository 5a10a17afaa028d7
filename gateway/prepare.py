"""The worker-side half of every request (on the engine thread, after rendering): the output
budget, the sampling, the request class and the policy's controller, as one `Prepared`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from toolflash.engine.api import ContextLengthError, Engine, GenerationRequest, ModeController
from toolflash.engine.sparse import SparsePrefill
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.errors import BadRequest
from toolflash.gateway.prompt import Prompt, render_prompt
from toolflash.gateway.request import ApiRequest
from toolflash.gateway.sampling import resolve_sampling
from toolflash.gateway.worker import Prepared
from toolflash.policy.record import RecordedController, recording
from toolflash.policy.request_class import RequestClass, classify


@dataclass(frozen=True)
class ControllerRequest:
    """What a mode controller factory learns about a request (on the engine thread)."""

    model_id: str
    request_class: RequestClass
    response_format_json: bool
    start_in_reasoning: bool


# The adaptive policy's hook: a ModeController per request, or None for the server default.
ControllerFactory = Callable[[ControllerRequest], ModeController | None]
# The policy files' sparse-prefill keep ratio for (model id, request class), None: not set.
SparsePolicy = Callable[[str, RequestClass], float | None]


def sparse_prefill(
    requested: float | None,
    klass: RequestClass,
    engine: Engine,
    config: GatewayConfig,
    policy: SparsePolicy | None,
) -> SparsePrefill | None:
    """The request's sparse prefill: its own keep ratio, else its class's in the policy
    files, else the server's; None (dense) when none is set or the ratio is 1."""
    keep = requested
    if keep is None and policy is not None:
        keep = policy(engine.model_id, klass)
    if keep is None:
        keep = config.sparse_prefill
    if keep is None or keep >= 1.0:
        return None
    return SparsePrefill(keep, config.sparse_min_tokens)


def token_budget(
    prompt_len: int, requested: int | None, context_length: int, default_cap: int
) -> tuple[int, bool]:
    """(max_tokens, clamped): the requested output limit, or the remaining context capped at
    `default_cap` when none was requested; a request asking for more than fits is clamped to the
    remaining context (and says so) rather than refused, since agents send their configured
    output limit whatever the prompt length."""
    if prompt_len == 0:
        raise BadRequest("the prompt is empty", param="prompt")
    room = context_length - prompt_len
    if room < 1:
        raise ContextLengthError(prompt_len, requested or 0, context_length)
    if requested is None:
        return min(room, default_cap), False
    return min(requested, room), requested > room


def decision_log(
    factory: ControllerFactory | None,
    engine: Engine,
    request_class: RequestClass,
    *,
    start_in_reasoning: bool = False,
    response_format_json: bool = False,
) -> RecordedController | None:
    """The policy's controller for this request, keeping the decision records the response
    serves (a controller that keeps none is wrapped to record its changes of mode)."""
    if factory is None:
        return None
    controller = factory(
        ControllerRequest(engine.model_id, request_class, response_format_json, start_in_reasoning)
    )
    return recording(controller) if controller is not None else None


def request_class(req: ApiRequest, prompt: Prompt, sampled: bool) -> RequestClass:
    """What the request asks for, as the policy keys its decisions."""
    conv = req.conversation
    if conv is None:  # raw text: no tools, no format, no template
        return classify(
            tools_offered=False,
            tool_choice="none",
            response_format=None,
            enable_thinking=None,
            last_role=None,
            prompt_tokens=len(prompt.tokens),
            sampled=sampled,
        )
    bound = prompt.constraint
    return classify(
        tools_offered=conv.offered_tools is not None,
        tool_choice=conv.tool_choice.kind,
        response_format=conv.json_format.kind if conv.json_format else None,
        enable_thinking=conv.enable_thinking,
        last_role=conv.last_role,
        prompt_tokens=len(prompt.tokens),
        strict_tools=bound is not None and bound.kind == "tool_calls" and not bound.require_call,
        sampled=sampled,
    )


def preparer(
    req: ApiRequest,
    prompt: Prompt,
    config: GatewayConfig,
    request_id: str,
    controller_factory: ControllerFactory | None = None,
    sparse_policy: SparsePolicy | None = None,
) -> Callable[[Engine], Prepared]:
    """The worker-side half of a request rendered already (on a render thread)."""

    def prepare(engine: Engine) -> Prepared:
        max_tokens, clamped = token_budget(
            len(prompt.tokens), req.max_tokens, engine.context_length, config.default_max_tokens
        )
        sampling = resolve_sampling(req.sampling, engine.generation_defaults, engine.vocab_size)
        klass = request_class(req, prompt, sampled=not sampling.params.greedy)
        request = GenerationRequest(
            prompt_tokens=prompt.tokens,
            max_tokens=max_tokens,
            mode=config.mode,
            block_size=config.block_size,
            stop_strings=req.stop,
            ignore_eos=req.ignore_eos,
            sampling=sampling.params,
            logprobs=req.logprobs,
            request_id=request_id,
            publish_at=prompt.publish_at,
            constraint=prompt.constraint,
            sparse_prefill=sparse_prefill(req.sparse_prefill, klass, engine, config, sparse_policy),
        )
        return Prepared(
            request,
            klass,
            prompt.start_in_reasoning,
            clamped,
            decision_log(
                controller_factory,
                engine,
                klass,
                start_in_reasoning=prompt.start_in_reasoning,
                response_format_json=klass.kind == "json",
            ),
            sampling_defaults=sampling.from_model_defaults,
        )

    return prepare


def prepare_now(
    req: ApiRequest, engine: Engine, config: GatewayConfig, request_id: str
) -> Prepared:
    """Render and prepare a request on this thread, as the server would (calibration)."""
    return preparer(req, render_prompt(req, engine), config, request_id)(engine)
