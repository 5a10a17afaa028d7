"""Text from tokens: the incremental detokenizer with stop strings cut exactly (`TextTracker`),
and what the engine checks once about its tokenizer (the fast backend under a wrapper, whether
it decodes as the wrapper does, the most characters one token spells)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .stops import visible_text


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token can decode to. A byte-level BPE vocabulary entry has one
    character per byte (>= the characters it decodes to); other vocabularies spell tokens
    with their characters. Falls back to a bound no tokenizer reaches in practice."""
    try:
        vocab = tokenizer.get_vocab()
        return max(max(len(t) for t in vocab), 1)
    except Exception:  # no vocabulary to read: a loose bound (only a quick refusal is lost)
        return 1024


def fast_backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` under an mlx-lm wrapper around a Hugging Face fast
    tokenizer, or None when there is none."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None or not callable(getattr(backend, "get_added_tokens_decoder", None)):
        return None
    # Only where it tokenizes exactly as the wrapper's `encode` (a wrapper could add its own
    # handling): checked once on text with added tokens, spaces and non-ASCII.
    added = " ".join(t.content for t in backend.get_added_tokens_decoder().values())
    probe = f"{added}\n  héllo, 世界 🙂\n\n{added}x  "
    try:
        same = list(backend.encode(probe, add_special_tokens=False).ids) == list(
            tokenizer.encode(probe, add_special_tokens=False)
        )
    except Exception:  # any tokenizer that cannot: keep tokenizing through `encode`
        return None
    return backend if same else None


def decodes_as_wrapper(tokenizer: Any, backend: Any) -> bool:
    """Whether `backend.decode` gives the wrapper's `decode` text: checked once on every run
    of one to three tokens of text with added tokens, spaces and characters split across
    tokens (a wrapper that cleans up spaces, or decodes its own way, fails it)."""
    if backend is None:
        return False
    added = " ".join(t.content for t in backend.get_added_tokens_decoder().values())
    probe = f"{added}\n  héllo, 世界 🙂 ( x ) ; y's .\n\n{added}x  "
    try:
        ids = list(backend.encode(probe, add_special_tokens=False).ids)
        runs = [ids] + [ids[i : i + n] for n in (1, 2, 3) for i in range(len(ids))]
        return all(
            backend.decode(r, skip_special_tokens=False) == tokenizer.decode(r) for r in runs
        )
    except Exception:  # any tokenizer that cannot: keep decoding through `decode`
        return False


class TextTracker:
    """Turns committed tokens into text deltas; EOS tokens never become text, and text from a
    stop string on is never shown.

    Decoding is incremental (as vLLM's detokenizer does): each step decodes only a window from
    the previous step's boundary, and the text before it is kept, so a long generation does not
    re-decode all its tokens at every step. The window's first tokens are context, so tokenizers
    that drop a leading space at the start of a decode still produce the right difference."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        stop_strings: Sequence[str],
        eos: frozenset[int],
    ):
        self.decode = decode
        self.stop_strings = stop_strings
        self.eos = eos
        self.tokens: list[int] = []
        self.sent = 0
        self.stopped = False
        self._stable = ""  # text of tokens[:_read]
        self._prefix = 0  # window start: context for decoding tokens[_read:]
        self._read = 0

    def _text(self) -> str:
        """The text of all tokens so far (a trailing incomplete character stays U+FFFD)."""
        before = self.decode(self.tokens[self._prefix : self._read])
        window = self.decode(self.tokens[self._prefix :])
        new = window[len(before) :]
        if not window.startswith(before) or window.endswith("\ufffd"):
            # Mid-character (or a tokenizer that rewrote the context): keep the window open.
            return self._stable + new if window.startswith(before) else self._full()
        self._stable += new
        self._prefix, self._read = self._read, len(self.tokens)
        return self._stable

    def _full(self) -> str:
        return self.decode(self.tokens)

    def push(self, tokens: Sequence[int]) -> str:
        if self.stopped:
            return ""
        self.tokens.extend(t for t in tokens if t not in self.eos)
        delta, self.stopped = visible_text(self._text(), self.sent, self.stop_strings)
        self.sent += len(delta)
        return delta

    def flush(self) -> str:
        """Text held back as a possible stop-string prefix, released at the end."""
        if self.stopped:
            return ""
        rest = self._full()[self.sent :]
        self.sent += len(rest)
        return rest
