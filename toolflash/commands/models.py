"""`toolflash models`: the embedded tiny models and the published target -> DFlash draft pairs."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toolflash.engine.registry import PAIRS, find_pair

TINY_ROOT = Path(__file__).resolve().parent.parent / "assets" / "tiny"


@dataclass(frozen=True)
class EmbeddedModel:
    """One model directory shipped under `toolflash/assets/tiny/`."""

    name: str
    path: str
    role: str  # "target" or "draft"
    model_type: str
    hidden_size: int | None
    num_layers: int | None
    vocab_size: int | None
    block_size: int | None
    size_mb: float


def _is_draft(cfg: dict[str, Any]) -> bool:
    return "dflash_config" in cfg or any("DFlash" in a for a in cfg.get("architectures") or [])


def embedded_models(root: Path | None = None) -> list[EmbeddedModel]:
    """Every `root/*/config.json`, classified as target or draft. Unreadable configs are
    listed with role "invalid" so that they show up rather than vanish."""
    models: list[EmbeddedModel] = []
    for cfg_file in sorted((root or TINY_ROOT).glob("*/config.json")):
        folder = cfg_file.parent
        size_mb = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError):
            cfg = None
        if not isinstance(cfg, dict):
            models.append(
                EmbeddedModel(folder.name, str(folder), "invalid", "?", None, None, None, None, 0.0)
            )
            continue
        text = cfg.get("text_config") or cfg
        block = cfg.get("block_size") or (cfg.get("dflash_config") or {}).get("block_size")
        models.append(
            EmbeddedModel(
                name=folder.name,
                path=str(folder),
                role="draft" if _is_draft(cfg) else "target",
                model_type=str(cfg.get("model_type", "?")),
                hidden_size=text.get("hidden_size"),
                num_layers=text.get("num_hidden_layers"),
                vocab_size=text.get("vocab_size"),
                block_size=block,
                size_mb=round(size_mb, 2),
            )
        )
    return models


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        nargs="?",
        help="a target (hub id or path): show which published draft toolflash would pair it with",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _table(rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    )


def run(args: argparse.Namespace) -> int:
    embedded = embedded_models()
    if args.name:
        pair = find_pair(args.name)
        if args.json:
            print(json.dumps({"name": args.name, "pair": asdict(pair) if pair else None}))
        elif pair:
            print(f"{args.name} -> {pair.draft} (target {pair.target}, family {pair.family})")
        else:
            print(f"{args.name}: no published DFlash draft (pass --draft explicitly)")
        return 0 if pair else 1
    if args.json:
        payload = {
            "embedded": [asdict(m) for m in embedded],
            "pairs": [asdict(p) for p in PAIRS],
        }
        print(json.dumps(payload, indent=2))
        return 0
    print(f"Embedded tiny models ({TINY_ROOT}):")
    if embedded:
        rows = [["NAME", "ROLE", "TYPE", "HIDDEN", "LAYERS", "VOCAB", "BLOCK", "MB"]]
        for m in embedded:
            rows.append(
                [
                    m.name,
                    m.role,
                    m.model_type,
                    *(str(v) if v is not None else "-" for v in (m.hidden_size, m.num_layers)),
                    *(str(v) if v is not None else "-" for v in (m.vocab_size, m.block_size)),
                    f"{m.size_mb:.1f}",
                ]
            )
        print(_table(rows))
    else:
        print("  none built")
    print("\nPublished target -> DFlash draft pairs (names match with or without org and")
    print("with -suffix/_suffix variants, e.g. mlx-community/Qwen3-4B-4bit):")
    rows = [["TARGET", "DRAFT", "FAMILY"]] + [[p.target, p.draft, p.family] for p in PAIRS]
    print(_table(rows))
    return 0
