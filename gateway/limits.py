"""Input limits, checked before anything reaches the JSON schema checker, the chat template, the
tokenizer or MLX: nesting depth, strings UTF-8 cannot encode, token ids, sizes against the
context, and `chat_template_kwargs`. Pure functions that raise `BadRequest` with `param` set.

Each closes a way one request could crash or stall the server: a token id past the embedding
table segfaulted MLX; a lone surrogate (`"\\ud800"`) raised TypeError in the tokenizer; a body
nested 100k deep raised RecursionError; template kwargs named like the server's own arguments
collided with them, and a huge string in one took the template 238 s and 18 GB to render.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from toolflash.gateway.errors import BadRequest, ContextTooLong, field_path

# A path as a linked list (parent, key): built for every container, read only on an error.
_Link = tuple[Any, str | int] | None


def _path(link: _Link) -> str:
    parts: list[str | int] = []
    while link is not None:
        link, key = link
        parts.append(key)
    return field_path(parts[::-1]) or "body"


def encodable(text: str) -> bool:
    """True when `text` is valid Unicode for UTF-8 (no lone surrogates)."""
    if text.isascii():  # O(1) for CPython's compact strings: the common case costs nothing
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json_tree(body: Any, max_depth: int) -> None:
    """Refuse a parsed body nested deeper than `max_depth` or holding a string (key or value)
    that UTF-8 cannot encode. Iterative, so no depth can exhaust Python's stack here (a 4 MB
    body of a million empty objects takes ~0.5 s, on a render thread)."""
    stack: list[tuple[Any, int, _Link]] = [(body, 1, None)]
    while stack:
        node, depth, link = stack.pop()
        items: Iterable[tuple[str | int, Any]]
        if isinstance(node, dict):
            for key in node:
                if not encodable(key):
                    raise _unencodable(link)
            items = node.items()
        else:
            items = enumerate(node)
        for key, value in items:
            if isinstance(value, str):
                if not encodable(value):
                    raise _unencodable((link, key))
            elif isinstance(value, dict | list):
                if depth >= max_depth:
                    where = _path((link, key))
                    raise BadRequest(
                        f"{where}: the request body is nested more than {max_depth} levels deep",
                        param=where,
                    )
                if value:  # an empty container holds nothing more to check
                    stack.append((value, depth + 1, (link, key)))


def _unencodable(link: _Link) -> BadRequest:
    where = _path(link)
    return BadRequest(
        f"{where}: the string is not valid Unicode (a lone surrogate such as \\ud800 "
        "cannot be encoded as UTF-8)",
        param=where,
    )


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str = "prompt") -> None:
    """Every id must index the model's vocabulary (ids past it reached MLX's embedding)."""
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise BadRequest(
                f"{param}[{i}]: token id {t} is outside the model's vocabulary "
                f"(0..{vocab_size - 1})",
                param=param,
            )


def check_max_tokens(requested: int | None, context_length: int, param: str) -> None:
    """An output limit no prompt could leave room for (1e9 against a 4k context) is a 400, as
    OpenAI's and vLLM's; one that fits the context but not beside this prompt is clamped
    later (`serving.token_budget`), since agents send their configured limit whatever the
    prompt length."""
    if requested is not None and requested >= context_length:
        raise BadRequest(
            f"{param} is {requested}, but this model's maximum context length is "
            f"{context_length} tokens (prompt and output together)",
            param=param,
            code="context_length_exceeded",
        )


def check_prompt_chars(chars: int, context_length: int, max_token_chars: int, param: str) -> None:
    """A prompt of `chars` characters needs at least chars / max_token_chars tokens (no token
    spells more than `max_token_chars` characters): past the context it cannot fit, so it is
    refused without tokenizing any of it."""
    if chars > context_length * max(1, max_token_chars):
        raise ContextTooLong(
            f"This model's maximum context length is {context_length} tokens. The prompt has "
            f"{chars} characters and no token spells more than {max_token_chars}, so it "
            "cannot fit.",
            param=param,
        )


def text_chars(value: Any) -> int:
    """Characters in all strings of a JSON value (keys included): what a template renders."""
    total = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            total += len(node)
        elif isinstance(node, dict):
            total += sum(len(k) for k in node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return total


def check_template_kwargs(
    kwargs: Mapping[str, Any] | None,
    allowed: Collection[str],
    reserved: Collection[str],
    max_chars: int,
) -> None:
    """`chat_template_kwargs` may only set keys the server allows, never one the server passes
    itself, and only to JSON scalars (a template option is a switch, not a document)."""
    for key, value in (kwargs or {}).items():
        param = f"chat_template_kwargs.{key}"
        if key in reserved:
            raise BadRequest(
                f"{param}: '{key}' is set by the server and cannot be overridden",
                param=param,
            )
        if key not in allowed:
            raise BadRequest(
                f"{param}: unknown chat template option; allowed: "
                f"{', '.join(sorted(allowed)) or 'none'}",
                param=param,
            )
        if not (value is None or isinstance(value, bool | int | float | str)):
            raise BadRequest(f"{param}: must be a string, number, boolean or null", param=param)
        if isinstance(value, str) and len(value) > max_chars:
            raise BadRequest(
                f"{param}: {len(value)} characters, more than the {max_chars} allowed",
                param=param,
            )
