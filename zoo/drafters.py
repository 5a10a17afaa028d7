"""The family's last stages: prompt files (the distillation pool of `prompt_pool.py`), one
DFlash drafter per target (trained by `toolflash.training` on the target's own greedy
continuations), and the held-out benchmark prompts shipped beside the models."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from toolflash.zoo.corpus import eval_prompts
from toolflash.zoo.records import Prompt, PromptKind, Record

log = structlog.get_logger(__name__)

PROMPT_KINDS: tuple[PromptKind, ...] = ("free_text", "code", "tool_call", "json")


def prompt_json(prompt: Prompt) -> dict[str, Any]:
    """One prompt as a chat request line (what `toolflash train-draft --data` and
    `toolflash bench --prompts` read)."""
    kwargs: dict[str, Any] = {"enable_thinking": prompt.enable_thinking}
    line: dict[str, Any] = {"kind": prompt.kind, "messages": prompt.messages}
    if prompt.tools:
        line["tools"] = prompt.tools
        kwargs["tool_call_format"] = prompt.tool_call_format
    line["chat_template_kwargs"] = kwargs
    return line


def write_prompts(prompts: Iterable[Prompt], path: Path) -> int:
    """Write prompts as chat request lines; returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps(prompt_json(p), ensure_ascii=False) + "\n")
            n += 1
    return n


def held_out_prompts(per_kind: int, seed: int = 0) -> list[Prompt]:
    """Held-out prompts of every kind (never seen in training): evaluation and benchmarks."""
    return [p for kind in PROMPT_KINDS for p in eval_prompts(kind, per_kind, seed)[:per_kind]]


def train_family_drafter(
    target_dir: Path,
    out_dir: Path,
    train_file: Path,
    eval_file: Path,
    *,
    layers: int | None = None,
    block_size: int = 16,
    epochs: float = 3.0,
    steps: int | None = None,
    max_new_tokens: int = 192,
    seed: int = 0,
    progress: bool = True,
    distill_batch: int = 64,
) -> dict[str, Any]:
    """Train and evaluate one drafter (real draft-verify loop); returns its report."""
    from toolflash.engine.factory import load_target
    from toolflash.training.data import load_prompt_records, stop_token_ids
    from toolflash.training.draft_config import resolve_mask_token_id
    from toolflash.training.pipeline import DraftJob, train_draft
    from toolflash.training.trainer import TrainConfig

    target, tokenizer, config = load_target(target_dir)
    train_records = load_prompt_records(train_file, tokenizer)
    eval_records = load_prompt_records(eval_file, tokenizer)
    job = DraftJob(
        mask_token_id=resolve_mask_token_id(tokenizer, target.vocab_size),
        layers=layers,
        block_size=block_size,
        max_new_tokens=max_new_tokens,
        distill_batch=distill_batch,
        train=TrainConfig(steps=steps, epochs=epochs, seed=seed),
    )
    result = train_draft(
        target,
        config,
        train_records,
        eval_records,
        stop_token_ids(tokenizer),
        out_dir,
        job,
        progress=progress,
        extra_report={"target_path": str(target_dir), "data_path": str(train_file)},
    )
    log.info("zoo.drafter.done", target=str(target_dir), out=str(out_dir))
    return result.report


def records_from_jsonl(path: Path) -> list[Record]:
    """Corpus records written by `build_family` (corpus.jsonl)."""
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(Record(**json.loads(line)))
    return out


def prompts_to_dicts(prompts: Iterable[Prompt]) -> list[dict[str, Any]]:
    return [asdict(p) for p in prompts]
