"""Named recipes for `toolflash zoo build`: every setting that decides what the family is.

A recipe fixes the corpus size, each target's training run and each drafter's distillation
and training, so that one name plus a seed regenerates a family. `cpu` made the files under
`toolflash/assets/tiny` in 38 minutes on 2 CPU cores with OpenBLAS (the README's rebuild
command; `toolflash zoo compare` checks a rebuild against them); `h200` holds the settings of
the first embedded family, trained on an H200 (hours on that CPU); `quick` is a smoke test of
every stage in minutes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI's parser imports this module: keep MLX out of it
    from toolflash.zoo.target_configs import Family


_BOTH: tuple[Family, ...] = ("qwen3", "qwen3_5")  # target_configs.FAMILIES, without MLX


@dataclass(frozen=True)
class TargetRecipe:
    """One target's training run (`train_target`)."""

    steps: int
    batch_size: int
    seq_len: int
    lr: float
    # Architecture keys to replace (tests build test-size families with it).
    config_overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DrafterRecipe:
    """One drafter: its distillation prompts, its shape and its training run."""

    pool: int  # prompts drawn by `distillation_pool` (its order is seeded)
    steps: int
    prompts: int | None = None  # distil only the pool's first N (None: all of it)
    with_corpus: bool = True  # also draw the build's corpus conversations
    max_prompt_tokens: int = 1536
    max_new_tokens: int = 128  # greedy continuation length
    batch_size: int = 64  # sequences per training step
    lr: float = 6e-4  # the published rate; short runs may take more
    layers: int = 1
    block_size: int = 16
    target_layer_ids: tuple[int, ...] | None = (1, 2, 3)
    distill_batch: int = 16  # speed only: batched and one-at-a-time outputs are equal
    eval_per_kind: int = 6  # held-out prompts per kind for the real-loop evaluation


@dataclass(frozen=True)
class FamilyRecipe:
    """Everything `build_family` and the drafter stage need besides the seed and paths."""

    name: str
    summary: str
    corpus_size: int
    targets: Mapping[Family, TargetRecipe]
    drafters: Mapping[Family, DrafterRecipe]  # empty: targets only

    def only(self, families: tuple[Family, ...]) -> FamilyRecipe:
        """The same recipe restricted to `families`."""
        return replace(
            self,
            targets={f: r for f, r in self.targets.items() if f in families},
            drafters={f: r for f, r in self.drafters.items() if f in families},
        )

    def without_drafters(self) -> FamilyRecipe:
        return replace(self, drafters={})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Sized from rates measured on 2 cores with OpenBLAS, the two families built in parallel (one
# worker and one BLAS thread each) with the CPU-fast training math: a target step of 4 x 256
# tokens ~0.5 s in each worker (in a 5-minute sweep, batch 4 x 256 reached a lower loss than
# 8 x 256 or 4-8 x 512), distillation ~0.16 s a prompt, a drafter step of 16 sequences ~0.5 s
# (the hybrid) to ~1.3 s (qwen3). The qwen3 chain (target, then drafter) is the longer one, so
# the hybrid's drafter gets twice the steps in the same wall time. Drafters get steps rather
# than prompts: below a few hundred steps they stay at loss ~5 whatever the lr.
CPU = FamilyRecipe(
    name="cpu",
    summary="the embedded family: about 40 minutes on 2 CPU cores (OpenBLAS)",
    corpus_size=3_000_000,
    targets=dict.fromkeys(_BOTH, TargetRecipe(steps=2200, batch_size=4, seq_len=256, lr=3e-3)),
    drafters={
        "qwen3": DrafterRecipe(pool=600, steps=900, batch_size=16, lr=2e-3, max_prompt_tokens=1024),
        "qwen3_5": DrafterRecipe(
            pool=800, steps=1800, batch_size=16, lr=2e-3, max_prompt_tokens=1024
        ),
    },
)

# The first embedded family (replaced by the `cpu` recipe's output on 2026-12-04; MODEL_CARD.md
# has its figures): targets and drafters were trained on an H200 with these settings, from the corpus this recipe builds (same digest). Both drafters
# distilled a part of their pool where a device command's time ran out: qwen3 the first 42,000
# prompts; the hybrid ~614 from each of 14 interleaved shards, i.e. the pool's first ~8,600
# (`prompts` takes exactly the first 8,595, so a few prompts at the edge differ).
H200 = FamilyRecipe(
    name="h200",
    summary="the first embedded family's settings (GPU-sized: about 8 hours on 2 CPU cores)",
    corpus_size=3_000_000,
    targets={
        "qwen3": TargetRecipe(steps=1500, batch_size=8, seq_len=512, lr=2e-3),
        "qwen3_5": TargetRecipe(steps=1200, batch_size=16, seq_len=256, lr=3e-3),
    },
    drafters={
        "qwen3": DrafterRecipe(pool=60_000, prompts=42_000, steps=3000, distill_batch=512),
        "qwen3_5": DrafterRecipe(pool=14_000, prompts=8_595, with_corpus=False, steps=3000),
    },
)

QUICK = FamilyRecipe(
    name="quick",
    summary="smoke test of every stage (minutes); the models are not useful",
    corpus_size=300_000,
    targets=dict.fromkeys(_BOTH, TargetRecipe(steps=20, batch_size=8, seq_len=256, lr=3e-3)),
    drafters=dict.fromkeys(
        _BOTH, DrafterRecipe(pool=32, steps=10, max_new_tokens=32, eval_per_kind=1)
    ),
)

RECIPES: dict[str, FamilyRecipe] = {r.name: r for r in (CPU, H200, QUICK)}
