"""Sampling defaults from a model directory's `generation_config.json` (Hugging Face format).

Qwen3's file, for example, says `do_sample: true, temperature: 0.6, top_k: 20, top_p: 0.95`:
requests that leave these fields out are served with them. As in `transformers`, the
temperature only counts when `do_sample` is true (otherwise the model's default is greedy);
`top_p`, `top_k` and `min_p` are taken as written (they only matter once sampling). Keys
toolflash does not implement (`repetition_penalty`, ...) are logged and left out.
"""

from __future__ import annotations

import json
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

# Field -> the range a usable value lies in (others are logged and ignored).
_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (1e-9, 1.0),
    "top_k": (0.0, float(2**31)),
    "min_p": (0.0, 1.0),
}
# Implemented elsewhere or not at all, with their neutral values.
_UNSUPPORTED = {"repetition_penalty": 1.0, "typical_p": 1.0, "epsilon_cutoff": 0.0}


def read_generation_defaults(model_dir: Path) -> dict[str, float]:
    """{field: value} for temperature/top_p/top_k/min_p; {} when the file is absent."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("generation_config_unreadable", path=str(path), error=str(exc))
        return {}
    if not isinstance(config, dict):
        return {}
    out: dict[str, float] = {}
    for key, (lo, hi) in _RANGES.items():
        value = config.get(key)
        if key == "temperature" and config.get("do_sample") is not True:
            continue
        if value is None:
            continue
        if not _number(value) or not lo <= float(value) <= hi:
            log.warning("generation_config_value_ignored", path=str(path), field=key, value=value)
            continue
        out[key] = float(int(value)) if key == "top_k" else float(value)
    ignored = [k for k, neutral in _UNSUPPORTED.items() if config.get(k, neutral) != neutral]
    if ignored:
        log.info("generation_config_ignored", path=str(path), fields=ignored)
    return out


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
