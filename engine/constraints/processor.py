"""`GrammarProcessor`: the `LogitsProcessor` that keeps the output inside a grammar.

AR: one mask per step on the target's logits. Speculative: the matcher walks the drafted tokens,
computing the mask of every verify row (row i after committed + draft[:i]); the first drafted
token the grammar forbids ends the allowed prefix (rows past it are left as they are: never
used); the matcher is rolled back to the committed state and only `commit` advances it. The
target's choice at every row is the masked argmax, so the accepted output is exactly what
constrained AR decoding produces. `forced` offers the grammar's fast-forward tokens (a stretch
the grammar fixes, e.g. `{"name": "`) so the session can verify them without running the drafter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import mlx.core as mx
import numpy as np
import structlog
from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from ..api import ConstraintStats

log = structlog.get_logger(__name__)


class GrammarProcessor:
    """Masks target logits to the tokens `matcher` allows; follows the committed output."""

    def __init__(
        self,
        matcher: LLMatcher,
        mask_vocab: int,
        eos_ids: Sequence[int],
        *,
        fast_forward: bool = True,
        min_forced: int = 1,
    ) -> None:
        self.matcher = matcher
        self.mask_vocab = mask_vocab  # the tokenizer's vocabulary (logits may be wider)
        self.eos_ids = tuple(eos_ids)
        self.fast_forward = fast_forward
        self.min_forced = min_forced
        self._stats = ConstraintStats()
        self._forced: list[int] = []  # the last forced run offered, until committed

    # -- LogitsProcessor -----------------------------------------------------------------
    def process(self, logits: mx.array, draft: Sequence[int]) -> tuple[mx.array, int]:
        t0 = time.perf_counter()
        n = int(logits.shape[0])
        draft = [int(t) for t in draft]
        forced = bool(draft) and draft == self._forced
        bitmask = allocate_token_bitmask(n, self.mask_vocab)
        allowed = len(draft)
        consumed = 0
        m = self.matcher
        for i in range(n):
            fill_next_token_bitmask(m, bitmask, i)
            if not bitmask[i].any():  # error state: end the output rather than pick at random
                log.warning("grammar_dead_end", error=m.get_error())
                words = bitmask.view(np.uint32)
                words[i] = 0
                for eos in self.eos_ids:
                    words[i, eos // 32] |= np.uint32(1 << (eos % 32))
            if i >= len(draft):
                break
            tok = draft[i]
            if not _allowed(bitmask[i], tok):
                allowed = i
                break
            if tok in self.eos_ids:  # allowed EOS ends the output: nothing after it matters
                allowed = i + 1
                break
            if not m.consume_token(tok):
                allowed = i
                break
            consumed += 1
        if consumed:
            m.rollback(consumed)
        checked = 0 if forced else len(draft)
        out = apply_bitmask(logits, bitmask)
        self._stats += ConstraintStats(
            mask_rows=min(n, allowed + 1, len(draft) + 1),
            mask_s=time.perf_counter() - t0,
            drafted=checked,
            grammar_rejected=len(draft) - allowed if checked else 0,
            grammar_cuts=int(bool(checked) and allowed < len(draft)),
        )
        return out, allowed

    def commit(self, tokens: Sequence[int]) -> None:
        self._forced = []
        for tok in tokens:
            # EOS ends the generation; llguidance refuses it once the grammar has stopped.
            if tok in self.eos_ids and self.matcher.is_accepting():
                return
            if not self.matcher.consume_token(int(tok)):
                log.warning("grammar_commit_failed", error=self.matcher.get_error()[:500])
                return

    def forced(self, limit: int) -> list[int]:
        if not self.fast_forward or limit <= 0 or self.matcher.is_stopped():
            return []
        t0 = time.perf_counter()
        run = self.matcher.compute_ff_tokens()[:limit]
        offered = len(run) >= self.min_forced
        self._stats += ConstraintStats(
            mask_s=time.perf_counter() - t0,
            forced_runs=int(offered),
            forced_tokens=len(run) if offered else 0,
        )
        if not offered:
            return []
        self._forced = list(run)
        return list(run)

    def admissible(self, draft: Sequence[int]) -> int:
        """How many leading `draft` tokens the grammar allows after the committed output (an
        allowed EOS counts and ends it); the matcher is rolled back. Cheaper than a verify
        row's mask: a copied draft cut here verifies only what the grammar could accept."""
        tokens = [int(t) for t in draft]
        m = self.matcher
        end = next((i for i, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
        n = m.try_consume_tokens(tokens[:end]) if end and not m.is_stopped() else 0
        allowed = n + 1 if n == end < len(tokens) and m.is_accepting() else n
        if n:
            m.rollback(n)
        return allowed

    def guide(self, drafter_logits: mx.array) -> list[int]:
        """A greedy draft that stays inside the grammar: at each block position the drafter's
        best token the grammar allows after the tokens drafted before it (the matcher walks
        the draft and is rolled back). The drafter's own argmax is tried first; a mask is only
        computed where the grammar refuses it. Ends early where the grammar ends the output."""
        t0 = time.perf_counter()
        scores = np.array(drafter_logits.astype(mx.float32))
        n, width = scores.shape
        best = scores.argmax(axis=1)
        bitmask = allocate_token_bitmask(1, self.mask_vocab)
        m = self.matcher
        out: list[int] = []
        masks = consumed = 0
        for i in range(n):
            if m.is_stopped():
                break
            tok = int(best[i])
            if tok in self.eos_ids or m.try_consume_tokens([tok]) != 1:
                fill_next_token_bitmask(m, bitmask, 0)
                masks += 1
                bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:width]
                if not bits.any():
                    break
                row = np.full(width, -np.inf, dtype=np.float32)
                row[: bits.shape[0]] = np.where(
                    bits.astype(bool), scores[i, : bits.shape[0]], -np.inf
                )
                tok = int(np.argmax(row))
                if tok in self.eos_ids or m.try_consume_tokens([tok]) != 1:
                    out.append(tok)  # an allowed EOS ends the draft (not consumed)
                    break
            out.append(tok)
            consumed += 1
        if consumed:
            m.rollback(consumed)
        self._stats += ConstraintStats(mask_rows=masks, mask_s=time.perf_counter() - t0)
        return out

    def stats(self) -> ConstraintStats:
        """What this processor did so far (masks, draft checks, forced runs)."""
        return self._stats

    @property
    def accepting(self) -> bool:
        """Whether the output so far is a complete sentence of the grammar."""
        return self.matcher.is_accepting()


def _allowed(row: np.ndarray, token: int) -> bool:
    word = token // 32
    return word < row.shape[0] and bool((int(row[word]) >> (token % 32)) & 1)


def apply_bitmask(logits: mx.array, bitmask: np.ndarray) -> mx.array:
    """`logits` [n, V] with the tokens whose bit is clear in `bitmask` [>=n, words] set to
    -inf (bit j of word w is token 32*w + j; ids past the mask are never allowed)."""
    n, vocab = int(logits.shape[0]), int(logits.shape[1])
    bits = np.unpackbits(bitmask[:n].view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    if bits.shape[1] < vocab:  # logits wider than the tokenizer: padding ids are never valid
        bits = np.pad(bits, ((0, 0), (0, vocab - bits.shape[1])))
    keep = mx.array(bits.astype(np.bool_))
    return mx.where(keep, logits, mx.array(-mx.inf, dtype=logits.dtype))
