"""Sparse prefill per request class in the policy files: off unless a file opts a class in,
more specific patterns win (1.0 turns it back off), and bad values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolflash.policy.adaptive import AdaptivePolicy
from toolflash.policy.config import PolicyConfig, PolicyFileError
from toolflash.policy.request_class import RequestClass, classify


def klass(prompt_tokens: int, tools: bool = True) -> RequestClass:
    return classify(
        tools_offered=tools,
        tool_choice="auto" if tools else "none",
        response_format=None,
        enable_thinking=False,
        last_role="user",
        prompt_tokens=prompt_tokens,
    )


def test_off_by_default_and_per_class_when_a_file_says_so(tmp_path: Path) -> None:
    assert AdaptivePolicy(persist=False).sparse_prefill("m", klass(20000)) is None
    user = tmp_path / "sparse.yaml"
    user.write_text(
        "classes:\n"
        "  '*.ge16k': {'*': {sparse_prefill: 0.25}}\n"
        "  'chat.*.ge16k': {'*': {sparse_prefill: 1.0}}\n"
    )
    policy = AdaptivePolicy(PolicyConfig([user]), persist=False)
    assert policy.sparse_prefill("m", klass(20000)) == 0.25
    assert policy.sparse_prefill("m", klass(2000)) is None
    assert policy.sparse_prefill("m", klass(20000, tools=False)) == 1.0


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2"])
def test_bad_keep_ratios_are_refused(tmp_path: Path, value: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"classes:\n  '*': {{'*': {{sparse_prefill: {value}}}}}\n")
    with pytest.raises(PolicyFileError, match="sparse_prefill"):
        PolicyConfig([bad])
