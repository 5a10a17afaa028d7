"""Long agent prompts for the sparse-prefill benchmarks: the zoo's agent dialogues with
distractor context, written once to `benchmarks/data/long_prompts.jsonl` and read back.

Each prompt is one zoo dialogue's opening (its system prompt, tools and the user request that
its assistant answers with tool calls) with earlier turns from other seeded dialogues in front
of the request (their user turns, tool calls, tool results with file contents, and answers)
until the rendered prompt reaches the target length; their tools join the tool list (at most
`MAX_TOOLS`), as an agent's context grows over a session. The model's answer to the last turn
is what the quality benchmark compares between dense and sparse prefill.

    python benchmarks/sparse_prompts.py --lengths 4096,8192,16384 --per-length 8
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from script_env import ensure_optimized_blas_for_script

from toolflash.zoo import stdlib_source as stdlib
from toolflash.zoo.dialogues import dialogue

DATA = Path(__file__).resolve().parent / "data" / "long_prompts.jsonl"
MAX_TOOLS = 16
SEED = 2028


def _material(rng: random.Random) -> tuple[list[str], list[tuple[str, str]]]:
    """Stdlib snippets (file contents read by the coding dialogues); no tool-free chats."""
    files = list(stdlib.stdlib_files())
    rng.shuffle(files)
    code: list[str] = []
    for rel in files[:40]:
        chunks = stdlib.code_chunks(stdlib.read_source(rel))
        code += [c[:1800] for c in rng.sample(chunks, min(2, len(chunks)))]
    return code, []


def _requests(rng: random.Random, code: list[str]) -> Iterator[Any]:
    """Dialogues whose third message is the assistant's tool call answering the user."""
    while True:
        record = dialogue(rng, code, [])
        msgs = record.messages
        if len(msgs) > 2 and msgs[1]["role"] == "user" and msgs[2].get("tool_calls"):
            yield record


def build_prompt(
    rng: random.Random,
    code: list[str],
    target_tokens: int,
    count: Callable[[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]], int],
    max_tools: int = MAX_TOOLS,
) -> dict[str, Any]:
    """One prompt of at least `target_tokens` tokens (`count` renders and tokenizes) offering
    at most `max_tools` tools."""
    main = next(_requests(rng, code))
    system, request = main.messages[0], main.messages[1]
    tools = list(main.tools)[:max_tools]
    kwargs = {k: v for k, v in main.chat_kwargs().items() if k != "tools"}
    history: list[dict[str, Any]] = []
    expected = [c["function"] for c in main.messages[2]["tool_calls"]]
    while True:
        messages = [system, *history, request]
        n = count(messages, tools, kwargs)
        if n >= target_tokens:
            return {
                "target_tokens": target_tokens,
                "prompt_tokens": n,
                "messages": messages,
                "tools": tools,
                "chat_template_kwargs": kwargs,
                "reference_calls": expected,
            }
        d = dialogue(rng, code, [])
        history += d.messages[1:]
        names = {t["function"]["name"] for t in tools}
        for t in d.tools:
            if len(tools) < max_tools and t["function"]["name"] not in names:
                tools.append(t)
                names.add(t["function"]["name"])


def load_prompts(path: Path = DATA) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lengths", default="4096,8192,16384")
    ap.add_argument("--per-length", type=int, default=8)
    ap.add_argument("--model", default=None, help="whose tokenizer counts (default embedded)")
    ap.add_argument("--out", default=str(DATA))
    args = ap.parse_args(argv)
    from toolflash.engine.factory import build_engine

    engine = build_engine(args.model, no_draft=True)

    def count(msgs: list[dict[str, Any]], tools: list[dict[str, Any]], kw: dict[str, Any]) -> int:
        return len(engine.encode_chat(msgs, tools, kw))

    rng = random.Random(SEED)
    code, _ = _material(rng)
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        for i in range(args.per_length):
            row = build_prompt(rng, code, length, count)
            rows.append({"id": f"{length}-{i}", **row})
            print(f"{row['prompt_tokens']:>6} tokens  {len(row['tools'])} tools", file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
