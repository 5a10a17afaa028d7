"""A request's sampling fields -> the engine's `SamplingParams` (never imports mlx).

Precedence per field: the request's value, else the model's `generation_config.json` default
(`Engine.generation_defaults`), else OpenAI-neutral values with temperature 0 (greedy). OpenAI's
own default temperature is 1, but agents rarely send one and a served model's card says what it
wants; with neither, greedy output is what the speculative path reproduces token for token.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from toolflash.engine.api import SamplingParams
from toolflash.gateway.errors import BadRequest
from toolflash.gateway.protocol import SamplingInfo
from toolflash.gateway.request import SamplingFields


@dataclass(frozen=True)
class ResolvedSampling:
    """The engine's parameters and which fields came from the model's defaults."""

    params: SamplingParams
    from_model_defaults: tuple[str, ...]


def resolve_sampling(
    req: SamplingFields,
    defaults: Mapping[str, float],
    vocab_size: int,
) -> ResolvedSampling:
    """Merge request > model defaults > greedy, and check logit_bias ids against the
    vocabulary (400, param logit_bias). A sampled request without a seed gets a drawn one,
    reported in the response so the client can replay it."""
    used: list[str] = []

    def pick(name: str, value: float | None, neutral: float) -> float:
        if value is not None:
            return float(value)
        if name in defaults:
            used.append(name)
            return float(defaults[name])
        return neutral

    temperature = pick("temperature", req.temperature, 0.0)
    top_p = pick("top_p", req.top_p, 1.0)
    top_k = int(pick("top_k", req.top_k, 0))
    min_p = pick("min_p", req.min_p, 0.0)
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        token = int(key)
        if token >= vocab_size:
            raise BadRequest(
                f"logit_bias names token id {token}, outside the model's vocabulary "
                f"(0..{vocab_size - 1})",
                param="logit_bias",
            )
        bias[token] = float(value)
    seed = req.seed
    if seed is None and temperature > 0:
        seed = secrets.randbits(31)
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),  # -1 (vLLM's "off") and 0 both mean no top-k
        min_p=min_p,
        seed=seed,
        frequency_penalty=float(req.frequency_penalty or 0.0),
        presence_penalty=float(req.presence_penalty or 0.0),
        logit_bias=bias,
    )
    return ResolvedSampling(params, tuple(used) if temperature > 0 else ())


def sampling_info(params: SamplingParams, from_model_defaults: tuple[str, ...]) -> SamplingInfo:
    """The `toolflash.sampling` object of a response."""
    return SamplingInfo(
        method="greedy" if params.greedy else "sample",
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=params.seed,
        frequency_penalty=params.frequency_penalty,
        presence_penalty=params.presence_penalty,
        logit_bias_tokens=len(params.logit_bias),
        from_model_defaults=list(from_model_defaults),
    )
