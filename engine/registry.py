"""Published target -> DFlash draft pairs (z-lab drafts for Qwen3 and Qwen3.5/3.6 targets).

Resolution strips the org (or a local path's parents) and matches the target name exactly or
as a `name-...` / `name_...` variant such as mlx-community's quantized conversions
(`mlx-community/Qwen3-4B-4bit` -> `z-lab/Qwen3-4B-DFlash-b16`); the longest match wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["qwen3", "qwen3_5"]


@dataclass(frozen=True)
class DraftPair:
    """A target model name (without org) and the z-lab drafter trained for it."""

    target: str
    draft: str
    family: Family


# The packaged tiny pairs (target dir, draft dir under `assets_dir()`), by the model id each is
# served under; `--model` takes these ids too. The hybrid is the default: its drafter accepts
# ~7 tokens per cycle on free text (2-3x AR on a 2-core CPU), the Qwen3 pair's ~1.2, where
# speculation is slower than AR (MODEL_CARD.md). The Qwen3 pair stays for the pure-attention
# family (KV-trim rollback).
EMBEDDED_PAIRS: dict[str, tuple[str, str]] = {
    "toolflash-tiny-qwen35": ("qwen35-tiny", "qwen35-tiny-dflash"),
    "toolflash-tiny-qwen3": ("qwen3-tiny", "qwen3-tiny-dflash"),
}
EMBEDDED_MODEL = "toolflash-tiny-qwen35"

PAIRS: tuple[DraftPair, ...] = (
    DraftPair("Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", "qwen3_5"),
    DraftPair("Qwen3.5-9B", "z-lab/Qwen3.5-9B-DFlash", "qwen3_5"),
    DraftPair("Qwen3.5-27B", "z-lab/Qwen3.5-27B-DFlash", "qwen3_5"),
    DraftPair("Qwen3.5-35B-A3B", "z-lab/Qwen3.5-35B-A3B-DFlash", "qwen3_5"),
    DraftPair("Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash", "qwen3_5"),
    DraftPair("Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "qwen3_5"),
    DraftPair("Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", "qwen3"),
    DraftPair("Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "qwen3"),
)


def _base_name(model: str) -> str:
    return model.rstrip("/").rsplit("/", 1)[-1]


def find_pair(model: str, pairs: tuple[DraftPair, ...] = PAIRS) -> DraftPair | None:
    """The published pair for a hub id or local path, or None.

    Matching is case-insensitive on the name without org: `Qwen3-4B`, `Qwen3-4B-4bit` and
    `Qwen3-4B_mlx` match `Qwen3-4B`; `Qwen3-40B` does not."""
    name = _base_name(model).lower()
    best: DraftPair | None = None
    for pair in pairs:
        target = pair.target.lower()
        if name == target or name.startswith((target + "-", target + "_")):
            if best is None or len(pair.target) > len(best.target):
                best = pair
    return best


def draft_for(model: str) -> str | None:
    """The z-lab draft repo for `model`, or None when no published draft fits it."""
    pair = find_pair(model)
    return pair.draft if pair else None
