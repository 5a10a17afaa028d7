"""Which prompt chunks a sparse prefill computes: structural rules first, then a score.

The prompt is cut into chunks of `chunk` tokens (the last one ends at the prompt end). A budget
of about `keep` of the prompt's tokens is spent in this order:

1. what must stay: the dense prefix restored from the prefix cache (computed already, and a
   sparse session may only be seeded by a prefix before its first dropped chunk) and the last
   chunk (the first output token is chosen at the last prompt position);
2. the structural rules (scorers "structural" and "similarity"): the last turn from its start
   marker (the request itself and the generation header), the head of the prompt (the system
   prompt's opening), the chunks where each tool definition starts (its name) and the tool
   list's closing instructions (how to write a call);
3. the rest by score: "recent" and "structural" prefer the latest chunks, "similarity" the
   chunks whose mean input embedding is closest (cosine) to the last turn's.

"recent" skips the rules of step 2 but for the head (a StreamingLLM-style sink plus window).
Selection is pure (`choose_chunks`); only the similarity scores touch the model
(`similarity_scores`: one embedding lookup, no forward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx

from .sparse import ScorerName, SparsePrefill, SparseSelection

# The token that opens every message in Qwen-style chat templates.
MESSAGE_START = "<|im_start|>"
# The system prompt's opening kept by the head rule, in tokens.
HEAD_TOKENS = 128
# Text that opens one tool definition in the tool list (each is one JSON line) and the text
# that closes the list (the call-format instructions follow it).
TOOL_OPENERS = ('{"type": "function"',)
TOOLS_CLOSE = "</tools>"


@dataclass(frozen=True)
class PromptLayout:
    """What the rules read from a prompt: where each message starts (its start-marker token)
    and the token positions that must stay visible (tool definition openings, the end of the
    tool list)."""

    length: int
    message_starts: tuple[int, ...] = ()
    anchors: tuple[int, ...] = ()

    @property
    def last_turn(self) -> int:
        """Where the last message before the generation header starts (0 if unknown): the
        header is the last start marker, so the turn before it is the one before that."""
        starts = self.message_starts
        return starts[-2] if len(starts) >= 2 else (starts[0] if starts else 0)


def prompt_layout(
    prompt: Sequence[int], start_id: int | None, decode: Callable[[Sequence[int]], str]
) -> PromptLayout:
    """Message starts (positions of `start_id`, the chat template's `<|im_start|>`) and, in
    the first message (where templates render the tool list), the tokens where a tool
    definition opens or the list closes. Decodes only the first message, token by token."""
    starts = tuple(i for i, t in enumerate(prompt) if t == start_id) if start_id is not None else ()
    first_end = starts[1] if len(starts) > 1 else len(prompt)
    anchors: list[int] = []
    if starts:
        pieces = [decode([t]) for t in prompt[: min(first_end, len(prompt))]]
        offsets = [0]
        for piece in pieces:
            offsets.append(offsets[-1] + len(piece))
        text = "".join(pieces)
        for needle in (*TOOL_OPENERS, TOOLS_CLOSE):
            at = text.find(needle)
            while at >= 0:
                anchors.append(_token_at(offsets, at))
                at = text.find(needle, at + 1)
    return PromptLayout(len(prompt), starts, tuple(sorted(set(anchors))))


def _token_at(offsets: Sequence[int], char: int) -> int:
    """The token whose text covers character `char` (offsets: cumulative text lengths)."""
    lo, hi = 0, len(offsets) - 1
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if offsets[mid] <= char:
            lo = mid
        else:
            hi = mid
    return lo


def n_chunks(length: int, chunk: int) -> int:
    return -(-length // chunk)


def recency_scores(length: int, chunk: int) -> list[float]:
    """Later chunks first."""
    return [float(i) for i in range(n_chunks(length, chunk))]


def similarity_scores(
    embed: Callable[[mx.array], mx.array], prompt: Sequence[int], chunk: int, query_from: int
) -> list[float]:
    """Cosine between each chunk's mean input embedding and the mean embedding of
    prompt[query_from:] (the last turn): one embedding lookup of the prompt, no forward."""
    n = len(prompt)
    h = embed(mx.array([list(prompt)]))[0].astype(mx.float32)  # [n, H]
    pad = n_chunks(n, chunk) * chunk - n
    counts = mx.full((n_chunks(n, chunk),), float(chunk))
    if pad:
        h_pad = mx.concatenate([h, mx.zeros((pad, h.shape[1]), dtype=h.dtype)], axis=0)
        counts[-1] = float(chunk - pad)
    else:
        h_pad = h
    means = h_pad.reshape(-1, chunk, h.shape[1]).sum(axis=1) / counts[:, None]
    query = h[min(query_from, n - 1) :].mean(axis=0)
    unit = means / (mx.linalg.norm(means, axis=-1, keepdims=True) + 1e-6)
    q = query / (mx.linalg.norm(query) + 1e-6)
    scores: list[float] = (unit @ q).tolist()  # type: ignore[assignment]
    return scores


def choose_chunks(
    layout: PromptLayout,
    keep: float,
    chunk: int,
    scorer: ScorerName,
    scores: Sequence[float],
    dense_prefix: int = 0,
) -> SparseSelection:
    """The selection of about `keep` x the prompt's tokens, whole chunks only (module doc):
    required chunks, then (scorer permitting) the structural rules, then the best `scores`."""
    n = layout.length
    total = n_chunks(n, chunk)
    budget = max(1, round(keep * n / chunk))
    chosen: set[int] = set(range(n_chunks(dense_prefix, chunk))) | {total - 1}

    def take(indices: Sequence[int]) -> None:
        for i in indices:
            if len(chosen) >= budget:
                return
            chosen.add(i)

    take(range(n_chunks(min(HEAD_TOKENS, n), chunk)))
    if scorer != "recent":
        take(range(total - 1, layout.last_turn // chunk - 1, -1))  # the last turn, from its end
        take([a // chunk for a in layout.anchors])
    take(sorted(range(total), key=lambda i: (-scores[i], -i)))
    return SparseSelection(_ranges(sorted(chosen), chunk, n), chunk)


def _ranges(indices: Sequence[int], chunk: int, n: int) -> tuple[tuple[int, int], ...]:
    """Consecutive chunk indices merged into token ranges."""
    out: list[tuple[int, int]] = []
    for i in indices:
        lo, hi = i * chunk, min((i + 1) * chunk, n)
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def plan_sparse(
    settings: SparsePrefill,
    prompt: Sequence[int],
    layout: PromptLayout,
    embed: Callable[[mx.array], mx.array],
    dense_prefix: int = 0,
) -> SparseSelection | None:
    """The selection for this request, or None where it prefills dense: fewer than
    `min_tokens` tokens left after the cached prefix, or a budget that keeps everything."""
    n = len(prompt)
    if n - dense_prefix < max(settings.min_tokens, 1) or settings.keep >= 1.0:
        return None
    chunk = settings.chunk
    if settings.scorer == "similarity":
        scores = similarity_scores(embed, prompt, chunk, layout.last_turn)
    else:
        scores = recency_scores(n, chunk)
    selection = choose_chunks(layout, settings.keep, chunk, settings.scorer, scores, dense_prefix)
    return None if selection.kept >= n else selection
