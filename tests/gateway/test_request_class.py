"""Table test of the request classifier (policy/request_class.py)."""

from __future__ import annotations

import pytest

from toolflash.policy.request_class import RequestClass, classify, length_band

BASE = dict(
    tools_offered=False,
    tool_choice="auto",
    response_format=None,
    enable_thinking=None,
    last_role="user",
    prompt_tokens=100,
)

TABLE = [
    ({}, "chat.think-default.user.lt1k"),
    ({"tools_offered": True}, "tools.think-default.user.lt1k"),
    ({"tools_offered": True, "tool_choice": "none"}, "chat.think-default.user.lt1k"),
    ({"tools_offered": True, "strict_tools": True}, "tools-strict.think-default.user.lt1k"),
    (
        {"tools_offered": True, "strict_tools": True, "tool_choice": "required"},
        "tool-forced.think-default.user.lt1k",
    ),
    (
        {"tools_offered": True, "strict_tools": True, "response_format": "json_schema"},
        "json.think-default.user.lt1k",
    ),
    ({"tools_offered": True, "tool_choice": "required"}, "tool-forced.think-default.user.lt1k"),
    ({"tools_offered": True, "tool_choice": "named"}, "tool-forced.think-default.user.lt1k"),
    ({"tools_offered": False, "tool_choice": "required"}, "chat.think-default.user.lt1k"),
    ({"response_format": "json_schema", "tools_offered": True}, "json.think-default.user.lt1k"),
    ({"response_format": "json_object"}, "json.think-default.user.lt1k"),
    ({"response_format": "text"}, "chat.think-default.user.lt1k"),
    ({"enable_thinking": True}, "chat.think-on.user.lt1k"),
    ({"enable_thinking": False}, "chat.think-off.user.lt1k"),
    ({"last_role": "tool", "tools_offered": True}, "tools.think-default.tool-result.lt1k"),
    ({"last_role": "assistant"}, "chat.think-default.user.lt1k"),
    ({"prompt_tokens": 1023}, "chat.think-default.user.lt1k"),
    ({"prompt_tokens": 1024}, "chat.think-default.user.lt4k"),
    ({"prompt_tokens": 7400, "tools_offered": True}, "tools.think-default.user.lt16k"),
    ({"prompt_tokens": 16384}, "chat.think-default.user.ge16k"),
    # Sampled (temperature > 0 after model defaults): its own class, marked after the kind.
    ({"sampled": True}, "chat.sampled.think-default.user.lt1k"),
    (
        {"sampled": True, "tools_offered": True, "enable_thinking": False, "last_role": "tool"},
        "tools.sampled.think-off.tool-result.lt1k",
    ),
    ({"sampled": True, "response_format": "json_schema"}, "json.sampled.think-default.user.lt1k"),
    (
        {"sampled": True, "tools_offered": True, "tool_choice": "named"},
        "tool-forced.sampled.think-default.user.lt1k",
    ),
    (
        {"sampled": True, "tools_offered": True, "strict_tools": True, "prompt_tokens": 5000},
        "tools-strict.sampled.think-default.user.lt16k",
    ),
    ({"sampled": False}, "chat.think-default.user.lt1k"),
]


@pytest.mark.parametrize(("overrides", "label"), TABLE)
def test_classify_table(overrides: dict, label: str) -> None:
    rc = classify(**{**BASE, **overrides})
    assert isinstance(rc, RequestClass)
    assert rc.label == label


def test_sampled_and_greedy_differ() -> None:
    greedy, sampled = classify(**BASE), classify(**BASE, sampled=True)
    assert greedy != sampled and greedy.label != sampled.label
    assert not greedy.sampled and sampled.sampled


def test_frozen_and_hashable() -> None:
    rc = classify(**BASE)
    with pytest.raises(AttributeError):
        rc.kind = "json"  # type: ignore[misc]
    assert {rc: 1}[classify(**BASE)] == 1


def test_length_bands_monotonic() -> None:
    bands = [length_band(n) for n in (0, 1000, 2000, 5000, 20000, 10**6)]
    assert bands == ["lt1k", "lt1k", "lt4k", "lt16k", "ge16k", "ge16k"]
