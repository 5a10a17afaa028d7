"""A large, deduplicated pool of drafter distillation prompts from the zoo's own generators.

The drafter learns from the target's greedy continuations of these prompts, so the pool must be
large (thousands: 300 corpus prompts gave tau 1.07 on held-out free text, 10k gave 1.32) and
must never touch what evaluation uses:
- code and free-text prompts ask about functions of stdlib files outside the held-out split
  (`stdlib_source.is_held_out`), and skip any function whose header or source also occurs in a
  held-out file (a method copied between modules would otherwise leak);
- dialogues and JSON tasks come from random streams seeded by a string
  ("distillation-pool:<seed>:<stream>"), never from the integer stream `eval_prompts` uses.
  Separate streams still collide by chance where a generator has little variety (a tsconfig
  JSON task has a handful of settings), so the first `EVAL_GUARD` evaluation prompts of every
  kind for the eval seeds (0 and `seed`) are excluded by content;
- corpus prompts (the target's own training conversations), when given, are held-in already.

Kinds are filled to shares of the count (`DEFAULT_SHARES`); a kind whose sources run dry hands
its remainder to the others. With a tokenizer, prompts longer than `max_tokens` are dropped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import structlog

from toolflash.zoo import stdlib_source as stdlib
from toolflash.zoo.corpus import (
    _code_chat,
    _doc_chat,
    eval_prompts,
    prompts_from_record,
    training_prompts,
)
from toolflash.zoo.dialogues import dialogue
from toolflash.zoo.json_docs import json_chat
from toolflash.zoo.records import Prompt, PromptKind, Record

log = structlog.get_logger(__name__)

DEFAULT_SHARES: dict[PromptKind, float] = {
    "tool_call": 0.35,
    "free_text": 0.30,
    "code": 0.20,
    "json": 0.15,
}
DEFAULT_MAX_TOKENS = 1536
FUNCTIONS_PER_FILE_PASS = 3  # functions taken from each file per pass over the file list
SNIPPET_FILES = 64  # training files whose code chunks feed the coding dialogues
# A stream that offers this many prompts in a row without one being taken (duplicates, too
# long, or of kinds already full) is dropped: its variety is spent.
PATIENCE = 2000
EVAL_GUARD = 512  # evaluation prompts per kind and eval seed that the pool never contains


@dataclass
class _Stream:
    name: str
    kinds: frozenset[str]
    prompts: Iterator[Prompt]
    misses: int = 0


@dataclass
class _Picked:
    quotas: dict[str, int]
    by_kind: dict[str, list[Prompt]] = field(default_factory=dict)

    def open(self, kind: str) -> bool:
        return len(self.by_kind.setdefault(kind, [])) < self.quotas.get(kind, 0)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.by_kind.values())


def prompt_key(prompt: Prompt) -> str:
    """Identity of a prompt as the target sees it (messages, tools and template options)."""
    return json.dumps(
        [prompt.messages, prompt.tools, prompt.enable_thinking, prompt.tool_call_format],
        sort_keys=True,
        ensure_ascii=False,
    )


def distillation_pool(
    count: int,
    seed: int = 0,
    *,
    records: Sequence[Record] = (),
    tokenizer: Any = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    shares: Mapping[PromptKind, float] = DEFAULT_SHARES,
    eval_seeds: Iterable[int] | None = None,
) -> list[Prompt]:
    """`count` distinct distillation prompts (fewer only if every source runs dry), shuffled.

    `records` (a built corpus) adds its held-in conversation prefixes as a source; `tokenizer`
    (with a chat template) drops prompts over `max_tokens` tokens; `eval_seeds` (default 0
    and `seed`) are the `eval_prompts` seeds whose prompts are excluded. Same arguments, same
    list."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = random.Random(f"distillation-pool:{seed}:order")
    picked = _Picked(_quotas(count, shares))
    seen = set(_eval_keys(frozenset({0, seed} if eval_seeds is None else eval_seeds)))

    def take(prompt: Prompt) -> bool:
        if not picked.open(prompt.kind):
            return False
        key = prompt_key(prompt)
        if key in seen:
            return False
        if tokenizer is not None and len(_tokens(prompt, tokenizer)) > max_tokens:
            return False
        seen.add(key)
        picked.by_kind[prompt.kind].append(prompt)
        return True

    streams = _streams(seed, records)
    while True:
        streams = _fill(streams, picked, take)
        short = count - picked.total
        live = {k for s in streams for k in s.kinds} & set(picked.quotas)
        if short <= 0 or not live:
            break
        # Kinds still under quota have no live source: give their remainder to the others.
        for kind in picked.quotas:
            picked.quotas[kind] = len(picked.by_kind.get(kind, []))
        extra = _quotas(short, {k: v for k, v in shares.items() if k in live})
        for kind, n in extra.items():
            picked.quotas[kind] += n
    out = [p for kind in sorted(picked.by_kind) for p in picked.by_kind[kind]]
    rng.shuffle(out)
    if len(out) < count:
        log.warning("zoo.prompt_pool.short", wanted=count, got=len(out))
    log.info(
        "zoo.prompt_pool",
        prompts=len(out),
        seed=seed,
        by_kind={k: len(v) for k, v in sorted(picked.by_kind.items())},
    )
    return out


def _quotas(count: int, shares: Mapping[PromptKind, float]) -> dict[str, int]:
    """Largest-remainder split of `count` over the kinds by share."""
    total = sum(shares.values())
    if total <= 0:
        raise ValueError("prompt kind shares must sum to more than 0")
    exact = {k: count * v / total for k, v in shares.items()}
    quotas = {k: int(v) for k, v in exact.items()}
    by_remainder = sorted(exact, key=lambda k: exact[k] - quotas[k], reverse=True)
    for k in by_remainder[: count - sum(quotas.values())]:
        quotas[k] += 1
    return quotas


def _fill(streams: list[_Stream], picked: _Picked, take: Any) -> list[_Stream]:
    """Round-robin one prompt per useful stream until every quota is met or no stream can
    serve an open kind. Returns the streams still alive."""
    while True:
        useful = [s for s in streams if any(picked.open(k) for k in s.kinds)]
        if not useful:
            return streams
        for stream in useful:
            prompt = next(stream.prompts, None)
            if prompt is None or stream.misses >= PATIENCE:
                streams.remove(stream)
                log.info("zoo.prompt_pool.stream_done", stream=stream.name)
                continue
            stream.misses = 0 if take(prompt) else stream.misses + 1


def _streams(seed: int, records: Sequence[Record]) -> list[_Stream]:
    def rng(name: str) -> random.Random:
        # A string seed: a different stream from any integer-seeded one (eval_prompts).
        return random.Random(f"distillation-pool:{seed}:{name}")

    files = [f for f in stdlib.stdlib_files() if not stdlib.is_held_out(f)]
    rng("files").shuffle(files)
    code, chats = _dialogue_material(files[:SNIPPET_FILES], rng("material"))
    streams = [
        _Stream("stdlib", frozenset({"code", "free_text"}), _stdlib_prompts(files, rng("stdlib"))),
        _Stream(
            "dialogue",
            frozenset({"tool_call", "free_text"}),
            _forever(lambda r: dialogue(r, code, chats), rng("dialogue")),
        ),
        _Stream(
            "json",
            frozenset({"json"}),
            _forever(lambda r: json_chat(r, thinking=r.random() < 0.3), rng("json")),
        ),
    ]
    if records:
        held_in = training_prompts(records)
        rng("corpus").shuffle(held_in)
        kinds = frozenset(p.kind for p in held_in)
        streams.insert(0, _Stream("corpus", kinds, iter(held_in)))
    return streams


def _forever(make: Any, rng: random.Random) -> Iterator[Prompt]:
    while True:
        yield from prompts_from_record(make(rng))


def _stdlib_prompts(files: Sequence[str], rng: random.Random) -> Iterator[Prompt]:
    """Code or doc chats about training-file functions: a few functions per file per pass,
    so a small pool still spans many modules."""
    leaked = _held_out_functions()
    per_file = []
    for rel in files:
        fns = [
            f for f in stdlib.functions(rel) if f.header not in leaked and f.source not in leaked
        ]
        rng.shuffle(fns)
        per_file.append(fns)
        yield from _chats(fns[:FUNCTIONS_PER_FILE_PASS], rng)
    start = FUNCTIONS_PER_FILE_PASS
    while any(len(fns) > start for fns in per_file):
        for fns in per_file:
            yield from _chats(fns[start : start + FUNCTIONS_PER_FILE_PASS], rng)
        start += FUNCTIONS_PER_FILE_PASS


def _chats(fns: Iterable[stdlib.FunctionSource], rng: random.Random) -> Iterator[Prompt]:
    for fn in fns:
        record = _code_chat(fn, rng) if rng.random() < 0.5 else _doc_chat(fn, rng)
        yield from prompts_from_record(record)


@lru_cache(maxsize=1)
def _held_out_functions() -> frozenset[str]:
    """Headers and sources of every function in a held-out file."""
    out: set[str] = set()
    for rel in stdlib.stdlib_files():
        if stdlib.is_held_out(rel):
            for fn in stdlib.functions(rel):
                out.update((fn.header, fn.source))
    return frozenset(out)


@lru_cache(maxsize=4)
def _eval_keys(seeds: frozenset[int]) -> frozenset[str]:
    return frozenset(
        prompt_key(p)
        for s in sorted(seeds)
        for kind in DEFAULT_SHARES
        for p in eval_prompts(kind, EVAL_GUARD, s)
    )


def _dialogue_material(
    files: Sequence[str], rng: random.Random
) -> tuple[list[str], list[tuple[str, str]]]:
    """Code snippets (file contents in coding dialogues) and (question, answer) pairs (answered
    without tools) from training files, as the corpus gives its dialogues."""
    leaked = _held_out_functions()
    code: list[str] = []
    chats: list[tuple[str, str]] = []
    for rel in files:
        chunks = stdlib.code_chunks(stdlib.read_source(rel))
        code += [c[:900] for c in rng.sample(chunks, min(2, len(chunks)))]
        fns = [f for f in stdlib.functions(rel) if f.header not in leaked]
        for fn in rng.sample(fns, min(2, len(fns))):
            record = _code_chat(fn, rng) if rng.random() < 0.5 else _doc_chat(fn, rng)
            chats.append((record.messages[0]["content"], record.messages[1]["content"]))
    return code, chats


def _tokens(prompt: Prompt, tokenizer: Any) -> list[int]:
    return list(tokenizer.encode(prompt.render(tokenizer), add_special_tokens=False))
