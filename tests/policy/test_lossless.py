"""Policy-driven switching on the tiny random models keeps the output identical to AR."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.model_dirs import write_draft, write_qwen3_target
from toolflash.engine.api import GenerationRequest, TokenEvent
from toolflash.engine.factory import build_engine
from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig
from toolflash.policy.request_class import RequestClass

from .fakes import FakeClock

# Probe constantly, one step at a time: every step may change mode or block size (and is
# timed: a one-step probe has no step after its settling one).
RESTLESS = """
defaults: {block_sizes: [8, 4, 2], min_samples: 1000000}
estimates: {settle_steps: 0}
exploration:
  probe_spec_cycles: 1
  probe_ar_steps: 1
  budget_per_request: 1000
  backoff_base_steps: 1
  backoff_max_steps: 1
  skip_hopeless: false
decisions: {min_dwell: 0, recheck_every: 1}
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("models")
    config = write_qwen3_target(root / "target")
    write_draft(root / "draft", config)
    return build_engine(str(root / "target"), str(root / "draft"))


def tokens_of(events: Any) -> list[int]:
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]


@pytest.mark.parametrize("prompt_text", ["def add(a, b):", '{"name": "read_file"'])
def test_policy_switches_are_lossless(engine: Any, tmp_path: Path, prompt_text: str) -> None:
    file = tmp_path / "restless.yaml"
    file.write_text(RESTLESS)
    policy = AdaptivePolicy(PolicyConfig([file]), clock=FakeClock(), persist=False)
    prompt = tuple(engine.encode(prompt_text))
    reference = tokens_of(engine.generate(GenerationRequest(prompt, 48, mode="ar")))
    cls = RequestClass("tools", "off", False, "lt1k")
    controller = policy.controller_for(engine.model_id, cls, False)
    events = list(engine.generate(GenerationRequest(prompt, 48, mode="spec"), None, controller))
    assert tokens_of(events) == reference
    arms = [
        (e.cycle.mode, e.cycle.block_size) for e in events if isinstance(e, TokenEvent) and e.cycle
    ]
    transitions = {(a, b) for a, b in zip(arms, arms[1:]) if a != b}
    # Every arm ran: spec at several blocks, AR and lookup.
    assert {m for m, _ in arms} == {"spec", "ar", "lookup"}
    assert {b for m, b in arms if m == "spec"} >= {8, 4, 2}
    assert len(transitions) >= 4
    assert controller.probes >= 4 and len(controller.decisions) >= 4
