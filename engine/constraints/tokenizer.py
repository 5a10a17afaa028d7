"""The model tokenizer as an llguidance `LLTokenizer` (built once per tokenizer: ~0.1-1 s for
large vocabularies), and compiled grammars per tokenizer (a fresh matcher is a deep copy)."""

from __future__ import annotations

import copy
import threading
import weakref
from collections import OrderedDict
from typing import Any

import structlog
from llguidance import LLMatcher, LLTokenizer

from .grammar import ConstraintError

log = structlog.get_logger(__name__)

# Compiled grammars kept per tokenizer (a schema recurs across an agent's turns).
_GRAMMARS_PER_TOKENIZER = 64


class GrammarTokenizer:
    """An `LLTokenizer` for one model tokenizer, with a small cache of compiled matchers."""

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ConstraintError(
                "constrained decoding needs a fast (Rust `tokenizers`) tokenizer; "
                f"{type(tokenizer).__name__} has no backend_tokenizer"
            )
        # Serialize a copy without padding/truncation (what llguidance.hf.from_tokenizer does;
        # the engine's tokenizer is mlx-lm's wrapper, which forwards `backend_tokenizer`).
        backend = copy.copy(backend)
        backend.no_padding()
        backend.no_truncation()
        eos = sorted(int(t) for t in (getattr(tokenizer, "eos_token_ids", None) or ()))
        if not eos and getattr(tokenizer, "eos_token_id", None) is not None:
            eos = [int(tokenizer.eos_token_id)]
        # The vocabulary is the tokenizer's (with added tokens); wider logits are padded.
        self.ll = LLTokenizer(backend.to_str(), eos_token=eos or None)
        self.eos_ids = tuple(self.ll.eos_tokens)
        self._matchers: OrderedDict[str, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def is_special(self, tag: str) -> bool:
        """Whether `tag` is exactly one special token (then grammars match the token)."""
        ids = self.ll.tokenize_str(tag, parse_special=True)
        return len(ids) == 1 and self.ll.is_special_token(ids[0])

    def matcher(self, grammar: str) -> LLMatcher:
        """A fresh matcher for `grammar`; compiled once per tokenizer and copied after."""
        with self._lock:
            base = self._matchers.get(grammar)
            if base is not None:
                self._matchers.move_to_end(grammar)
                return base.deep_copy()
        base = LLMatcher(self.ll, grammar, log_level=0)
        if base.is_error():
            raise ConstraintError(f"grammar rejected: {base.get_error()}")
        with self._lock:
            self._matchers[grammar] = base
            while len(self._matchers) > _GRAMMARS_PER_TOKENIZER:
                self._matchers.popitem(last=False)
        return base.deep_copy()


_BY_TOKENIZER: weakref.WeakKeyDictionary[Any, GrammarTokenizer] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def grammar_tokenizer(tokenizer: Any) -> GrammarTokenizer:
    """The `GrammarTokenizer` of `tokenizer`, built on first use and kept while it lives."""
    with _LOCK:
        found = _BY_TOKENIZER.get(tokenizer)
    if found is not None:
        return found
    built = GrammarTokenizer(tokenizer)
    log.debug("grammar_tokenizer_built", vocab=built.ll.vocab_size, eos=built.eos_ids)
    with _LOCK:
        return _BY_TOKENIZER.setdefault(tokenizer, built)
