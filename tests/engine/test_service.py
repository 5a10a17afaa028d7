"""DFlashEngine through the real loading path: text, stops, modes, cancellation, errors."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from toolflash.engine.api import ContextLengthError, FinishEvent, GenerationRequest, TokenEvent
from toolflash.engine.factory import UnsupportedModelError, build_engine

from .model_dirs import write_draft, write_qwen3_target


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("models")
    config = write_qwen3_target(root / "target")
    write_draft(root / "draft", config)
    return build_engine(str(root / "target"), str(root / "draft"))


def collect(
    engine: Any, request: GenerationRequest, cancel: Any = None
) -> tuple[list[int], str, FinishEvent]:
    tokens: list[int] = []
    text = ""
    finish = None
    for event in engine.generate(request, cancel):
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
            text += event.text
        else:
            finish = event
    assert finish is not None
    return tokens, text, finish


def test_spec_equals_ar_through_the_engine(engine: Any) -> None:
    prompt = tuple(engine.encode_chat([{"role": "user", "content": "def add(a, b):"}]))
    ar = collect(engine, GenerationRequest(prompt, 64, mode="ar"))
    spec = collect(engine, GenerationRequest(prompt, 64, mode="spec"))
    assert ar[0] == spec[0] and ar[1] == spec[1]
    assert spec[2].stats.spec_cycles > 0 and ar[2].stats.spec_cycles == 0
    assert len(spec[0]) == spec[2].stats.completion_tokens
    # The text is exactly the decoded tokens (minus EOS).
    assert spec[1] == engine.decode([t for t in spec[0] if t not in engine.eos_ids])


def test_stop_string_is_cut_exactly(engine: Any) -> None:
    prompt = tuple(engine.encode("Hello world"))
    _, full_text, _ = collect(engine, GenerationRequest(prompt, 48, mode="ar"))
    assert len(full_text) > 12
    stop = full_text[9:12]
    for mode in ("ar", "spec"):
        tokens, text, finish = collect(
            engine, GenerationRequest(prompt, 48, mode=mode, stop_strings=(stop,))
        )
        assert text == full_text[: full_text.find(stop)]
        assert finish.finish_reason == "stop"
        assert stop in engine.decode(tokens)  # generation ended on the completing token


def test_max_tokens_and_mode_plan(engine: Any) -> None:
    prompt = tuple(engine.encode("import os"))
    ref, _, _ = collect(engine, GenerationRequest(prompt, 37, mode="ar"))
    plan = {1: "ar", 2: "ar", 5: "spec", 9: "ar", 12: "spec"}
    tokens, _, finish = collect(engine, GenerationRequest(prompt, 37, mode="spec", mode_plan=plan))  # type: ignore[arg-type]
    assert tokens == ref and len(tokens) == 37 and finish.finish_reason == "length"
    assert set(finish.stats.modes) == {"spec", "ar"}


def test_cancel_stops_within_a_cycle(engine: Any) -> None:
    prompt = tuple(engine.encode("def add"))
    cancel = threading.Event()
    events = engine.generate(GenerationRequest(prompt, 500, mode="spec"), cancel)
    next(events)
    next(events)
    cancel.set()
    rest = list(events)
    assert len(rest) <= 2 and isinstance(rest[-1], FinishEvent)
    assert rest[-1].finish_reason == "cancelled"


def test_prompt_beyond_context_is_refused(engine: Any) -> None:
    with pytest.raises(ContextLengthError, match="maximum context length is 2048"):
        list(engine.generate(GenerationRequest(tuple([5] * 2100), 10)))


def test_unknown_family_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(UnsupportedModelError, match="'llama'.*not supported"):
        build_engine(str(tmp_path))


class ScriptedController:
    """Alternates spec (block 4) and AR every other step; records what it was told."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, int, int]] = []
        self.finished: Any = None

    def prepare(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> None:
        self.prepared = (prompt_tokens, default_block_size, threading.current_thread().name)

    def observe_prefix(self, text: str) -> None:
        self.prefix = text

    def start(self, prompt_tokens: int, default_block_size: int, lookup_block: int = 0) -> Any:
        from toolflash.engine.api import ModeDecision

        return ModeDecision("spec", 4, "start")

    def after_step(self, record: Any, token_ids: Any, text: str) -> Any:
        from toolflash.engine.api import ModeDecision

        self.steps.append((record.mode, record.block_size, len(token_ids)))
        return ModeDecision("ar" if record.mode == "spec" else "spec", 4, "alternate")

    def finish(self, stats: Any) -> None:
        self.finished = stats


def test_controller_drives_modes_losslessly(engine: Any) -> None:
    prompt = tuple(engine.encode("def add(a, b):"))
    ref, _, _ = collect(engine, GenerationRequest(prompt, 40, mode="ar"))
    controller = ScriptedController()
    tokens: list[int] = []
    for event in engine.generate(GenerationRequest(prompt, 40, mode="spec"), None, controller):
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
    assert tokens == ref
    modes = [m for m, _, _ in controller.steps]
    assert modes[:4] == ["spec", "ar", "spec", "ar"]
    assert all(bs == 4 for m, bs, _ in controller.steps if m == "spec")
    assert controller.finished is not None and controller.finished.completion_tokens == len(ref)
    assert controller.prefix == engine.decode(ref[:1])  # the prefill's token reached it
    # prepare ran off the engine's thread, for this prompt and the engine's block
    assert controller.prepared[:2] == (len(prompt), engine.default_block_size)
    assert controller.prepared[2] != threading.current_thread().name


def test_controller_finishes_after_the_finish_event(engine: Any) -> None:
    """The controller's bookkeeping runs after the FinishEvent is out (off the response's
    path), also when the consumer stops there."""
    prompt = tuple(engine.encode("def add(a, b):"))
    controller = ScriptedController()
    events = engine.generate(GenerationRequest(prompt, 12, mode="spec"), None, controller)
    for event in events:
        if isinstance(event, FinishEvent):
            break
    assert isinstance(event, FinishEvent) and controller.finished is None
    events.close()
    assert controller.finished is event.stats


def test_tool_call_format_detection() -> None:
    from toolflash.engine.service import tool_call_format_of

    assert tool_call_format_of('{{ "<tool_call>\\n<function=" + name }}') == "qwen3_coder"
    assert tool_call_format_of('<tool_call>\\n{"name": {{ name }}}') == "hermes"
    both = '{% if xml %}<function={{ n }}>{% else %}{"name": {{ n }}}{% endif %}'
    assert tool_call_format_of(both) == "hermes"
