"""The stable prefix (where the prefix cache publishes) read off the prompt's own tokenization
equals what tokenizing the rendered prefix separately gave, on every tokenizer fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolflash.engine.factory import build_engine

from ..engine.model_dirs import write_draft, write_qwen3_target, write_qwen35_target

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file — UTF-8 text, ünïcödé names allowed.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
SYSTEM = {"role": "system", "content": "You are a coding agent.  \n\n"}
CONVERSATIONS: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]] = [
    ([{"role": "user", "content": "def add(a, b):"}], None, {}),
    ([SYSTEM, {"role": "user", "content": "hi"}], None, {}),
    ([SYSTEM, {"role": "user", "content": "read it"}], TOOLS, {}),
    (
        [SYSTEM, {"role": "user", "content": "日本語 🙂 naïve café\n"}],
        TOOLS,
        {"enable_thinking": False},
    ),
    ([{"role": "user", "content": "think"}], None, {"enable_thinking": True}),
    (
        [
            SYSTEM,
            {"role": "user", "content": "read main.py"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "print(1)\n   "},
            {"role": "user", "content": "<|im_ and   trailing spaces   "},
        ],
        TOOLS,
        {},
    ),
    (
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nb"},
            {"role": "user", "content": "c"},
        ],
        None,
        {},
    ),
]


@pytest.fixture(scope="module", params=["embedded", "qwen3", "qwen3_5"])
def engine(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if request.param == "embedded":
        return build_engine("toolflash-tiny-qwen3")
    writer = {"qwen3": write_qwen3_target, "qwen3_5": write_qwen35_target}[request.param]
    root: Path = tmp_path_factory.mktemp(request.param)
    write_draft(root / "draft", writer(root / "target"))
    return build_engine(str(root / "target"), str(root / "draft"))


def two_tokenizations(
    engine: Any, messages: Any, tools: Any, kwargs: Any, prompt: list[int] | None = None
) -> tuple[list[int], int]:
    """What the gateway computed before: tokenize the full prompt (unless given) and the
    prefix apart."""

    def render(generation_prompt: bool) -> str:
        return str(
            engine.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=generation_prompt,
                tokenize=False,
                **kwargs,
            )
        )

    prompt = engine.encode(render(True)) if prompt is None else prompt
    ids = engine.encode(render(False))
    n = len(ids) if 0 < len(ids) < len(prompt) and prompt[: len(ids)] == ids else 0
    return prompt, n


@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
def test_published_positions_are_unchanged(engine: Any, case: int) -> None:
    messages, tools, kwargs = CONVERSATIONS[case]
    want_prompt, want = two_tokenizations(engine, messages, tools, kwargs)
    prompt = engine.encode_chat(messages, tools, kwargs)
    assert prompt == want_prompt
    calls: list[str] = []
    encode = engine.encode
    engine.encode = lambda text: calls.append(text) or encode(text)
    try:
        got = engine.stable_prefix(messages, tools, kwargs, prompt)
    finally:
        del engine.encode
    assert got == want and want > 0
    assert not calls  # read off the prompt's tokenization: the prefix was not tokenized again
    if messages[1:]:
        # The history without its last message (as an earlier turn published it; some
        # templates render earlier turns differently, then the answer is 0 both ways).
        _, want_shorter = two_tokenizations(engine, messages[:-1], tools, kwargs, prompt)
        assert engine.stable_prefix(messages[:-1], tools, kwargs, prompt) == want_shorter


def test_other_prompts_and_inexact_boundaries_tokenize_the_prefix(engine: Any) -> None:
    messages, tools, kwargs = CONVERSATIONS[5]
    prompt = engine.encode_chat(messages, tools, kwargs)
    _, want = two_tokenizations(engine, messages, tools, kwargs)
    engine.encode_chat([{"role": "user", "content": "another request"}])
    assert engine.stable_prefix(messages, tools, kwargs, prompt) == want  # fallback path
    engine.encode_chat(messages, tools, kwargs)
    text = engine._last_chat.text
    # A boundary inside a piece (where a merge may cross it) is never read off the offsets.
    assert engine._prefix_from_offsets(text[:-3], prompt) is None
    assert engine._prefix_from_offsets(text[:-1] + "x", prompt) is None
    assert engine._prefix_from_offsets(text[:10], prompt[:-1]) is None


def test_a_wrapper_that_tokenizes_differently_keeps_two_tokenizations(engine: Any) -> None:
    from toolflash.engine.text import fast_backend

    class Shifted:
        """A wrapper whose `encode` is not its backend's (e.g. its own preprocessing)."""

        def __init__(self, inner: Any) -> None:
            self._tokenizer = inner._tokenizer
            self.inner = inner

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return list(self.inner.encode(" " + text, add_special_tokens=add_special_tokens))

    assert fast_backend(engine.tokenizer) is not None
    assert fast_backend(Shifted(engine.tokenizer)) is None


def test_render_threads_each_read_their_own_prompt(engine: Any) -> None:
    """The gateway renders on several threads at once: a thread's stable prefix is read off its
    own last prompt, never off another thread's (which would be the fallback at best)."""
    import threading

    messages, tools, kwargs = CONVERSATIONS[5]
    _, want = two_tokenizations(engine, messages, tools, kwargs)
    mine = engine.encode_chat(messages, tools, kwargs)
    other = threading.Thread(
        target=engine.encode_chat, args=([{"role": "user", "content": "another request"}],)
    )
    other.start()
    other.join()
    calls: list[str] = []
    encode = engine.encode
    engine.encode = lambda text: calls.append(text) or encode(text)
    try:
        assert engine.stable_prefix(messages, tools, kwargs, mine) == want
    finally:
        del engine.encode
    assert not calls  # this thread's encoding was still there to read
