"""Constrained requests under the adaptive policy on the shipped tiny pair: a forced tool call
(whose `<tool_call>` opening the grammar forces) is tracked as a tool-call span and measured
under its own class, like any other request; a sampled request is measured apart from greedy
ones."""

from __future__ import annotations

from typing import Any

import pytest

from toolflash.engine.api import (
    FinishEvent,
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
    ToolSpec,
)
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig
from toolflash.policy.request_class import classify

from .fakes import FakeClock

pytest.importorskip("mlx.core")

WEATHER = ToolSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
TOOL = {"type": "function", "function": {"name": WEATHER.name, "parameters": WEATHER.parameters}}


@pytest.fixture(scope="module")
def engine() -> Any:
    from toolflash.engine.factory import build_engine

    return build_engine("toolflash-tiny-qwen3")


def run(engine: Any, policy: AdaptivePolicy, sampling: SamplingParams) -> tuple[Any, str, Any]:
    prompt = engine.encode_chat(
        [{"role": "user", "content": "What's the weather in Oslo?"}],
        [TOOL],
        {"enable_thinking": False},
    )
    cls = classify(
        tools_offered=True,
        tool_choice="named",
        response_format=None,
        enable_thinking=False,
        last_role="user",
        prompt_tokens=len(prompt),
        sampled=not sampling.greedy,
    )
    ctrl = policy.controller_for(engine.model_id, cls, False)
    req = GenerationRequest(
        tuple(prompt),
        60,
        sampling=sampling,
        constraint=OutputConstraint("tool_calls", tools=(WEATHER,), parallel_calls=False),
    )
    events = list(engine.generate(req, controller=ctrl))
    text = "".join(getattr(e, "text", "") for e in events)
    finish = events[-1]
    assert isinstance(finish, FinishEvent)
    return ctrl, text, finish.stats


def test_forced_call_is_a_tool_call_span_measured_under_its_class(engine: Any) -> None:
    policy = AdaptivePolicy(PolicyConfig(), clock=FakeClock(), persist=False)
    greedy = SamplingParams()
    ctrl, text, stats = run(engine, policy, greedy)
    assert text.startswith('<tool_call>\n{"name": "get_weather"')
    assert ctrl.label == "tool-forced.think-off.user.lt1k"
    assert stats.constraint is not None and stats.constraint.forced_tokens > 0
    # The call (opened by the grammar, possibly in the prefill's token) is a tool-call span.
    assert [d["span"] for d in ctrl.decisions][0] == "tool_call"
    steps = {
        (r["labels"]["span"], r["labels"]["mode"]): r["value"]
        for r in policy.counters()["steps"]
        if r["labels"]["class"] == ctrl.label
    }
    assert steps.get(("tool_call", "spec"), 0) >= 1
    # Its spec cycles fed the estimates of (class, tool_call), as for unconstrained requests.
    tau = policy.model(engine.model_id).estimates.tau
    assert any(k[1] == ctrl.label and k[2] == "tool_call" for k in tau)

    sampled_ctrl, text, _ = run(engine, policy, SamplingParams(temperature=0.8, seed=3))
    assert text.startswith("<tool_call>")
    assert sampled_ctrl.label == "tool-forced.sampled.think-off.user.lt1k"
    assert any(k[1] == sampled_ctrl.label and k[2] == "tool_call" for k in tau)
