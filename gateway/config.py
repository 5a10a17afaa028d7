"""Gateway settings (what `toolflash serve` flags set)."""

from __future__ import annotations

from dataclasses import dataclass

from toolflash.engine.api import Mode


@dataclass(frozen=True)
class GatewayConfig:
    """Serving settings. `default_max_tokens` caps generations whose request names no limit
    (they otherwise fill the remaining context)."""

    mode: Mode = "spec"
    block_size: int | None = None
    max_queue: int = 16
    api_key: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    default_max_tokens: int = 8192
    served_model_names: tuple[str, ...] = ()
