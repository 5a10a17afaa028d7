"""The family's last stages: prompt files (the distillation pool of `prompt_pool.py`), one
DFlash drafter per target (trained by `toolflash.training` on the target's own greedy
continuations), and the held-out benchmark prompts shipped beside the models."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from toolflash.zoo.corpus import eval_prompts
from toolflash.zoo.recipes import DrafterRecipe
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


DRAFTER_SUFFIX = "-dflash"


@dataclass(frozen=True)
class PromptFiles:
    """A drafter's distillation prompts and its held-out evaluation prompts (chat JSONL)."""

    train: Path
    eval: Path
    train_count: int
    eval_count: int


def write_drafter_prompts(
    recipe: DrafterRecipe,
    records: Sequence[Record],
    tokenizer_dir: Path,
    out: Path,
    name: str,
    seed: int = 0,
) -> PromptFiles:
    """Draw `recipe`'s distillation pool (cut to its first `recipe.prompts`) and the held-out
    evaluation prompts, and write them as `out/prompts_{train,eval}_<name>.jsonl`."""
    from transformers import AutoTokenizer

    from toolflash.zoo.prompt_pool import distillation_pool

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    pool = distillation_pool(
        recipe.pool,
        seed,
        records=records if recipe.with_corpus else (),
        tokenizer=tokenizer,
        max_tokens=recipe.max_prompt_tokens,
    )
    train = out / f"prompts_train_{name}.jsonl"
    held_out = out / f"prompts_eval_{name}.jsonl"
    n_train = write_prompts(pool[: recipe.prompts], train)
    n_eval = write_prompts(held_out_prompts(recipe.eval_per_kind, seed), held_out)
    return PromptFiles(train, held_out, n_train, n_eval)


def build_drafter(
    recipe: DrafterRecipe,
    target_dir: Path,
    out_dir: Path,
    prompts: PromptFiles,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Distil, train, write and evaluate one drafter as `recipe` says; returns a summary of its
    report (the full report is `out_dir/training_report.json`)."""
    from toolflash.engine.factory import load_target
    from toolflash.training.data import load_prompt_records, stop_token_ids
    from toolflash.training.draft_config import resolve_mask_token_id
    from toolflash.training.pipeline import DraftJob, train_draft
    from toolflash.training.trainer import TrainConfig

    target, tokenizer, config = load_target(target_dir)
    job = DraftJob(
        mask_token_id=resolve_mask_token_id(tokenizer, target.vocab_size),
        layers=recipe.layers,
        block_size=recipe.block_size,
        target_layer_ids=list(recipe.target_layer_ids) if recipe.target_layer_ids else None,
        max_new_tokens=recipe.max_new_tokens,
        distill_batch=recipe.distill_batch,
        train=TrainConfig(
            steps=recipe.steps, batch_size=recipe.batch_size, lr=recipe.lr, seed=seed
        ),
    )
    report = train_draft(
        target,
        config,
        load_prompt_records(prompts.train, tokenizer),
        load_prompt_records(prompts.eval, tokenizer),
        stop_token_ids(tokenizer),
        out_dir,
        job,
        progress=progress,
        extra_report={"target_path": str(target_dir), "data_path": str(prompts.train)},
    ).report
    log.info("zoo.drafter.done", target=str(target_dir), out=str(out_dir))
    evaluation = report.get("evaluation") or {}
    kinds = evaluation.get("kinds") or {}
    return {
        "prompts": prompts.train_count,
        "examples": report["data"]["examples"],
        "response_tokens": report["data"]["response_tokens"],
        "time_s": report["time_s"],
        "loss_last": report["training"]["loss_last"],
        "tokens_per_cycle": (evaluation.get("overall") or {}).get("tokens_per_cycle"),
        "by_kind": {
            kind: {
                "tokens_per_cycle": figures["tokens_per_cycle"],
                "spec_over_ar": _ratio(figures["spec_tokens_per_s"], figures["ar_tokens_per_s"]),
            }
            for kind, figures in kinds.items()
        },
        "lossless": evaluation.get("lossless"),
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


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
