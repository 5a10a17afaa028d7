"""What a family is made of, file by file: digests of the files that ship, and a comparison.

A build records `family_files(out)` in `build.json`; the embedded family ships that record, so
`toolflash zoo compare DIR` can say whether a rebuild reproduced the embedded files byte for byte.
Training logs (`training.json`, `training_report.json`) hold wall times and paths, so they are
not part of a family's identity.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from toolflash.zoo.drafters import DRAFTER_SUFFIX
from toolflash.zoo.target_configs import DIR_NAMES
from toolflash.zoo.tokenizer import TOKENIZER_FILES

SHIPPED_NAMES = frozenset({"model.safetensors", "config.json", *TOKENIZER_FILES})
MODEL_DIRS = tuple(d + suffix for d in DIR_NAMES.values() for suffix in ("", DRAFTER_SUFFIX))


def family_files(root: Path) -> dict[str, str]:
    """sha256 of every shipped file in the family's model directories under `root`."""
    return {
        f"{d}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
        for d in MODEL_DIRS
        if (root / d).is_dir()
        for p in sorted((root / d).iterdir())
        if p.name in SHIPPED_NAMES
    }


def family_size_mb(root: Path) -> float:
    """Total size of the model and tokenizer files under `root` (what would ship)."""
    total = sum(p.stat().st_size for p in root.rglob("*") if p.name in SHIPPED_NAMES)
    return round(total / 1e6, 2)


@dataclass(frozen=True)
class FileComparison:
    """One file of a reference family, and whether a built family has the same bytes."""

    path: str
    status: Literal["same", "differs", "missing"]


def compare_families(built: dict[str, str], reference: dict[str, str]) -> list[FileComparison]:
    """Compare a build's file digests with a reference's, file by file (the reference's files)."""
    return [
        FileComparison(
            path,
            "missing" if path not in built else "same" if built[path] == digest else "differs",
        )
        for path, digest in sorted(reference.items())
    ]
