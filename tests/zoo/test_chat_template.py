"""The zoo chat template: Qwen3 tool listing, hermes/XML tool-call markup, thinking switches."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from mlx_lm.tool_parsers import json_tools, qwen3_coder

from toolflash.zoo.tokenizer import template_renderer
from toolflash.zoo.tools_catalog import BY_NAME

TOOLS = [BY_NAME["get_weather"].schema(), BY_NAME["grep"].schema(), BY_NAME["todo_write"].schema()]
CALLS = [
    {"name": "get_weather", "arguments": {"city": "São Paulo", "units": "metric"}},
    {
        "name": "grep",
        "arguments": {"pattern": "def \\w+\\(", "path": "src", "case_insensitive": True},
    },
    {
        "name": "todo_write",
        "arguments": {"todos": [{"content": 'Fix <b> & "q"', "status": "pending"}]},
    },
]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Weather in São Paulo, find function defs, track a todo."},
    {
        "role": "assistant",
        "content": "Running three tools.",
        "reasoning_content": "Three independent calls.",
        "tool_calls": [{"type": "function", "function": c} for c in CALLS],
    },
    {"role": "tool", "content": '{"temperature": 21}'},
    {"role": "tool", "content": '{"count": 2}'},
    {"role": "tool", "content": '{"ok": true}'},
]


def _render(tok, messages, **kwargs) -> str:  # type: ignore[no-untyped-def]
    return str(tok.apply_chat_template(messages, tokenize=False, **kwargs))


def _blocks(text: str) -> list[str]:
    return re.findall(r"<tool_call>(.*?)</tool_call>", text, flags=re.S)


def test_tools_listed_qwen3_style(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = _render(hf_tokenizer, CONVERSATION[:2], tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a coding agent.\n\n# Tools\n")
    listed = re.search(r"<tools>\n(.*?)\n</tools>", text, flags=re.S)
    assert listed is not None
    assert [json.loads(line) for line in listed.group(1).split("\n")] == TOOLS


@pytest.mark.parametrize("fmt", [None, "hermes"])
def test_hermes_calls_parse_back(hf_tokenizer, fmt) -> None:  # type: ignore[no-untyped-def]
    kwargs = {"tool_call_format": fmt} if fmt else {}
    text = _render(hf_tokenizer, CONVERSATION, tools=TOOLS, **kwargs)
    calls = _blocks(text.split("Running three tools.", 1)[1])
    assert [json_tools.parse_tool_call(c, TOOLS) for c in calls] == CALLS
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "São Paulo"' in text


def test_qwen3_coder_calls_parse_back(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = _render(hf_tokenizer, CONVERSATION, tools=TOOLS, tool_call_format="qwen3_coder")
    assert "<function=example_function_name>" in text  # the system prompt teaches the XML format
    calls = _blocks(text.split("Running three tools.", 1)[1])
    assert [qwen3_coder.parse_tool_call(c, TOOLS) for c in calls] == CALLS
    assert (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
        "<parameter=units>\nmetric\n</parameter>\n</function>\n</tool_call>" in text
    )


def test_tool_results_become_one_user_turn(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = _render(hf_tokenizer, CONVERSATION, tools=TOOLS)
    assert text.endswith(
        '<|im_start|>user\n<tool_response>\n{"temperature": 21}\n</tool_response>\n'
        '<tool_response>\n{"count": 2}\n</tool_response>\n'
        '<tool_response>\n{"ok": true}\n</tool_response><|im_end|>\n'
    )


def test_reasoning_rendered_in_think_block(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = _render(hf_tokenizer, CONVERSATION, tools=TOOLS)
    assert (
        "<|im_start|>assistant\n<think>\nThree independent calls.\n</think>\n\nRunning three tools.\n<tool_call>"
        in text
    )


def test_enable_thinking_switch(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    msgs = [{"role": "user", "content": "hi"}]
    on = _render(hf_tokenizer, msgs, add_generation_prompt=True)
    on_explicit = _render(hf_tokenizer, msgs, add_generation_prompt=True, enable_thinking=True)
    off = _render(hf_tokenizer, msgs, add_generation_prompt=True, enable_thinking=False)
    assert on == on_explicit == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_answer_without_reasoning_matches_thinking_off_prompt(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # Training text of a thinking-off answer continues exactly the enable_thinking=False prompt.
    msgs = [{"role": "user", "content": "hi"}]
    prompt = _render(hf_tokenizer, msgs, add_generation_prompt=True, enable_thinking=False)
    full = _render(hf_tokenizer, msgs + [{"role": "assistant", "content": "Hello!"}])
    assert full == prompt + "Hello!<|im_end|>\n"


def test_history_before_last_query_has_no_think_block(hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "c"},
    ]
    text = _render(hf_tokenizer, msgs, add_generation_prompt=True)
    assert "old thoughts" not in text and "<|im_start|>assistant\nb<|im_end|>" in text


def test_jinja_renderer_matches_transformers(hf_tokenizer, small_corpus) -> None:  # type: ignore[no-untyped-def]
    template = template_renderer()
    chats = [r for r in small_corpus if r.is_chat][:40]
    for record in chats:
        ours = template.render(messages=record.messages, **record.chat_kwargs())
        assert ours == _render(hf_tokenizer, record.messages, **record.chat_kwargs())


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_quality_check_accepts_rendered_calls(hf_tokenizer, fmt) -> None:  # type: ignore[no-untyped-def]
    from toolflash.zoo.quality import check_tool_calls

    text = _render(hf_tokenizer, CONVERSATION, tools=TOOLS, tool_call_format=fmt)
    answer = text.split("Running three tools.", 1)[1]
    check = check_tool_calls(answer, fmt, TOOLS)
    assert check.well_formed and check.parsed == CALLS
    broken = check_tool_calls(answer.replace("</function>", "", 1).replace('"}', "", 1), fmt, TOOLS)
    assert not broken.well_formed
    unterminated = check_tool_calls(answer.rsplit("</tool_call>", 1)[0], fmt, TOOLS)
    assert unterminated.blocks == 3 and len(unterminated.parsed) == 2
    assert not unterminated.well_formed
