"""Output constraints (grammar-constrained decoding): logits processors that mask the target's
logits so the output follows a grammar (JSON Schema, forced or strict tool calls).

`grammar` (no mlx) turns an `OutputConstraint` into an llguidance grammar and checks schemas for
the gateway; `tokenizer` converts the model tokenizer once; `processor` holds the
`GrammarProcessor` the token chooser applies in AR and speculative mode alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..api import GenerationRequest

if TYPE_CHECKING:
    from ..choosers import LogitsProcessor


def constraint_processors(
    request: GenerationRequest,
    tokenizer: Any,
    *,
    fast_forward: bool = True,
    min_forced: int = 1,
) -> Sequence[LogitsProcessor]:
    """The processors enforcing `request.constraint` (none without one). `fast_forward` lets
    the session verify grammar-forced stretches (of at least `min_forced` tokens) without
    running the drafter."""
    if request.constraint is None:
        return ()
    # Imported here: the gateway imports this package's grammar module and must not load mlx.
    from .grammar import build_grammar
    from .processor import GrammarProcessor
    from .tokenizer import grammar_tokenizer

    gt = grammar_tokenizer(tokenizer)
    matcher = gt.matcher(build_grammar(request.constraint, gt.is_special))
    return (
        GrammarProcessor(
            matcher,
            gt.ll.vocab_size,
            gt.eos_ids,
            fast_forward=fast_forward,
            min_forced=min_forced,
        ),
    )
