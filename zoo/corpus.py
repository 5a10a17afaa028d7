"""The zoo's offline, seeded corpus: stdlib code, code chats, agent tool dialogues and JSON.

`build_corpus(seed, size)` returns the same records (byte for byte once rendered) for the same
seed, Python version and `size`. Evaluation prompts come from held-out stdlib files (5% by path
hash) and from a separate random stream of dialogues/JSON tasks (`eval_prompts`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Iterator
from typing import Any

import structlog

from toolflash.zoo import stdlib_source as stdlib
from toolflash.zoo.dialogues import dialogue
from toolflash.zoo.json_docs import json_chat, json_document
from toolflash.zoo.records import Prompt, PromptKind, Record, RecordKind

log = structlog.get_logger(__name__)

# Share of the byte budget per record kind: about half code, half agent/JSON traffic.
MIX: dict[RecordKind, float] = {
    "code_raw": 0.24,
    "code_chat": 0.16,
    "doc_chat": 0.06,
    "tool_chat": 0.40,
    "json_doc": 0.06,
    "json_chat": 0.08,
}
DEFAULT_SIZE = 3_000_000
EVAL_SEED_OFFSET = 1_000_003  # eval dialogues/JSON tasks come from a stream disjoint from training

CODE_ASKS = (
    "Write the function `{name}` from the `{module}` module:\n\n```python\n{header}\n```",
    "Implement this Python function:\n\n```python\n{header}\n```",
    "Complete the body of `{name}`.\n\n```python\n{header}\n```",
    "{header}\n\nFill in the implementation.",
)
CODE_LEADS = ("", "", "Here is `{name}`:\n\n", "Here is an implementation:\n\n", "Sure.\n\n")
DOC_ASKS = (
    "What does `{module}.{name}` do?",
    "Explain the function {name} in the {module} module.",
    "In Python's {module}, what is {name} for?",
)


def record_size(record: Record) -> int:
    """Bytes a record contributes to the budget (its text, or its messages and tools as JSON)."""
    if record.text is not None:
        return len(record.text.encode())
    return len(json.dumps(record.messages, ensure_ascii=False).encode()) + len(
        json.dumps(record.tools, ensure_ascii=False).encode()
    )


def _first_paragraph(doc: str) -> str:
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def _code_chat(fn: stdlib.FunctionSource, rng: random.Random) -> Record:
    user = rng.choice(CODE_ASKS).format(name=fn.name, module=fn.module, header=fn.header)
    answer = rng.choice(CODE_LEADS).format(name=fn.name) + f"```python\n{fn.source}\n```"
    thinking = rng.random() < 0.25
    msg: dict[str, Any] = {"role": "assistant", "content": answer}
    if thinking:
        msg["reasoning_content"] = (
            f"The docstring says: {_first_paragraph(fn.doc)[:200]} I will write `{fn.name}`."
        )
    return Record(
        kind="code_chat",
        messages=[{"role": "user", "content": user}, msg],
        enable_thinking=thinking,
    )


def _doc_chat(fn: stdlib.FunctionSource, rng: random.Random) -> Record:
    user = rng.choice(DOC_ASKS).format(name=fn.name, module=fn.module)
    answer = _first_paragraph(fn.doc)
    if rng.random() < 0.5:
        answer += f"\n\nIts signature is:\n\n```python\n{fn.header.splitlines()[0]}\n```"
    return Record(
        kind="doc_chat",
        messages=[{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
    )


def _code_records(
    files: Iterable[str], rng: random.Random, budgets: dict[RecordKind, int]
) -> Iterator[Record]:
    """Raw chunks, code chats and doc chats from `files`, until each code budget is spent."""
    left = {k: budgets[k] for k in ("code_raw", "code_chat", "doc_chat")}
    for rel in files:
        if all(v <= 0 for v in left.values()):
            return
        if left["code_raw"] > 0:
            chunks = stdlib.code_chunks(stdlib.read_source(rel))
            for chunk in rng.sample(chunks, min(2, len(chunks))):
                rec = Record(kind="code_raw", text=f"# {rel}\n{chunk}\n")
                left["code_raw"] -= record_size(rec)
                yield rec
        fns = stdlib.functions(rel)
        for fn in rng.sample(fns, min(3, len(fns))):
            kind: RecordKind = "doc_chat" if rng.random() < 0.3 else "code_chat"
            if left[kind] <= 0:
                continue
            rec = _doc_chat(fn, rng) if kind == "doc_chat" else _code_chat(fn, rng)
            left[kind] -= record_size(rec)
            yield rec


def _snippets(records: list[Record], limit: int = 900) -> list[str]:
    return [r.text.split("\n", 1)[1][:limit] for r in records if r.kind == "code_raw" and r.text]


def _chat_pairs(records: list[Record]) -> list[tuple[str, str]]:
    return [
        (r.messages[0]["content"], r.messages[1]["content"])
        for r in records
        if r.kind in ("code_chat", "doc_chat")
    ]


def build_corpus(seed: int = 0, size: int = DEFAULT_SIZE) -> list[Record]:
    """Build the training corpus: about `size` bytes of records, mixed per `MIX`, shuffled.

    Same `seed` and `size` on the same Python version give the same records in the same order.
    """
    rng = random.Random(seed)
    budgets = {kind: int(size * share) for kind, share in MIX.items()}
    files = [f for f in stdlib.stdlib_files() if not stdlib.is_held_out(f)]
    rng.shuffle(files)
    records = list(_code_records(files, rng, budgets))
    code, chats = _snippets(records), _chat_pairs(records)

    def fill(kind: RecordKind, make: Any) -> None:
        left = budgets[kind]
        while left > 0:
            rec = make()
            left -= record_size(rec)
            records.append(rec)

    fill("tool_chat", lambda: dialogue(rng, code, chats))
    fill("json_doc", lambda: json_document(rng))
    fill("json_chat", lambda: json_chat(rng, thinking=rng.random() < 0.2))
    rng.shuffle(records)
    log.info(
        "corpus.built",
        seed=seed,
        records=len(records),
        bytes=sum(record_size(r) for r in records),
        stdlib_files=len(files),
        stdlib_hash=stdlib.file_list_hash(),
    )
    return records


def render_training_text(record: Record, tokenizer: Any) -> str:
    """The text a target trains on: chats through the chat template, raw text + `<|endoftext|>`."""
    if record.text is not None:
        return record.text + "<|endoftext|>"
    return str(
        tokenizer.apply_chat_template(record.messages, tokenize=False, **record.chat_kwargs())
    )


def corpus_digest(texts: Iterable[str]) -> str:
    """sha256 over rendered texts; equal digests mean byte-identical corpora."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


def _prompt_kind(record: Record, turn: dict[str, Any]) -> PromptKind:
    if turn.get("tool_calls"):
        return "tool_call"
    if record.kind == "code_chat":
        return "code"
    if record.kind == "json_chat":
        return "json"
    return "free_text"


def prompts_from_record(record: Record) -> list[Prompt]:
    """Every conversation prefix of a chat record that ends right before an assistant turn."""
    out: list[Prompt] = []
    for i, msg in enumerate(record.messages):
        if msg["role"] != "assistant":
            continue
        out.append(
            Prompt(
                kind=_prompt_kind(record, msg),
                messages=record.messages[:i],
                tools=record.tools,
                enable_thinking=record.enable_thinking,
                tool_call_format=record.tool_call_format,
                reference=msg,
            )
        )
    return out


def training_prompts(records: Iterable[Record]) -> list[Prompt]:
    """Prompts from held-in chat records (drafter distillation regenerates their answers)."""
    return [p for r in records if r.is_chat for p in prompts_from_record(r)]


def eval_prompts(kind: PromptKind, n: int = 8, seed: int = 0) -> list[Prompt]:
    """`n` held-out prompts of one kind: "free_text", "code", "tool_call" or "json".

    Code and free-text prompts come from held-out stdlib files; tool-call and JSON prompts from
    a dialogue stream seeded apart from any training seed.
    """
    rng = random.Random(seed + EVAL_SEED_OFFSET)
    out: list[Prompt] = []
    if kind in ("code", "free_text"):
        held = [f for f in stdlib.stdlib_files() if stdlib.is_held_out(f)]
        rng.shuffle(held)
        for rel in held:
            for fn in stdlib.functions(rel)[:2]:
                rec = _code_chat(fn, rng) if kind == "code" else _doc_chat(fn, rng)
                out.extend(prompts_from_record(rec))
            if len(out) >= n:
                break
    else:
        while len(out) < n:
            if kind == "json":
                rec = json_chat(rng, thinking=False)
            else:
                rec = dialogue(rng, [], [])
            out.extend(p for p in prompts_from_record(rec) if p.kind == kind)
    return out[:n]
