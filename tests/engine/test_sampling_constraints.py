"""Sampled decoding composes with grammar constraints: the SamplingChooser applies the grammar
processor to every target row, respects its allowed prefix and takes its forced runs as
one-hot proposals, so sampled JSON-schema output is valid in both modes."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from toolflash.engine.api import (
    FinishEvent,
    GenerationRequest,
    Mode,
    OutputConstraint,
    SamplingParams,
)
from toolflash.engine.factory import build_engine

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> Any:
    return build_engine("toolflash-tiny-qwen3")


@pytest.mark.parametrize("mode", ["spec", "ar"])
def test_sampled_json_follows_the_schema(engine: Any, mode: Mode) -> None:
    prompt = engine.encode_chat(
        [{"role": "user", "content": "Describe a user as JSON."}], None, {"enable_thinking": False}
    )
    outputs = set()
    for seed in (1, 2):
        request = GenerationRequest(
            tuple(prompt),
            160,
            mode=mode,
            sampling=SamplingParams(temperature=1.0, top_p=0.95, seed=seed),
            constraint=OutputConstraint("json", schema=SCHEMA),
        )
        text, reason = "", ""
        for event in engine.generate(request):
            if isinstance(event, FinishEvent):
                reason = event.finish_reason
            else:
                text += event.text
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)
        outputs.add(text)
    assert len(outputs) == 2  # sampled, not greedy
