"""`toolflash serve`'s own settings (the process, the model, the policy), each declared once.

With the gateway's (`gateway/config.py`) and the prefix cache's (`cache/config.py`) they are every
`toolflash serve` flag: `settings_cli` derives the flags, their help, the `--config` YAML keys,
`toolflash serve --defaults` and SETTINGS.md from these declarations.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from toolflash.cache.config import CacheConfig
from toolflash.engine.api import DEFAULT_DRAFT_LENGTH, DraftLength
from toolflash.engine.registry import EMBEDDED_MODEL
from toolflash.gateway.config import GatewayConfig

LogLevel = Literal["debug", "info", "warning", "error"]


class ServeSettings(BaseModel):
    """The server process: what it loads, where it listens, how it decides and logs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str | None = Field(
        default=None,
        description="target: a local directory, a hub id or an embedded pair (unset: the embedded"
        f" pair {EMBEDDED_MODEL})",
    )
    draft: str | None = Field(
        default=None,
        description="DFlash drafter: a local directory or hub id (unset: the embedded pair's, or"
        " the registry's published draft for the target)",
    )
    host: str = Field(default="127.0.0.1", description="bind address")
    port: int = Field(default=8000, ge=0, le=65535, description="port")
    draft_length: DraftLength = Field(
        default=DEFAULT_DRAFT_LENGTH,
        description="adaptive: a cycle drafts less after rejected drafts and back up to the block"
        " after accepted ones; fixed: every cycle drafts the whole block (a policy's block is the"
        " ceiling either way)",
    )
    policy: Literal["adaptive", "off"] = Field(
        default="adaptive",
        description="adaptive: choose AR, spec (and its block) or lookup per request class and span"
        " from measurements (`toolflash policy show`); off: always --mode",
    )
    policy_config: tuple[str, ...] = Field(
        default=(),
        description="extra policy YAML files, applied after the shipped ones (repeatable)",
    )
    state_dir: str | None = Field(
        default=None,
        description="where the adaptive policy keeps what it learned and its calibrations"
        " (policy-state.json, calibration/); give each server that must not share its own"
        " (unset: the policy files' state_dir, `toolflash policy show`)",
    )
    calibrate: bool = Field(
        default=True,
        description="on the first serve of a pair on this machine, measure it before serving"
        " (`toolflash calibrate`); --no-calibrate: the adaptive policy learns from requests alone",
        json_schema_extra={"flag": "no-calibrate"},
    )
    log_format: Literal["json", "console"] = Field(
        default="json",
        description="json: one JSON object per line on stderr; console: plain text lines (in"
        " colour only on a terminal)",
    )
    log_level: LogLevel = Field(default="info", description="least severe log level written")
    upstreams: str | None = Field(
        default=None,
        description="YAML file of upstream pools: models served by OpenAI-compatible servers"
        " (another toolflash, mlx-lm, vLLM, SGLang, llama.cpp) through this gateway, each pool's"
        " keys declared in gateway/upstream_config.py (SERVER.md, Upstream pools)",
    )
    distributed: str | None = Field(
        default=None,
        description="mlx.launch hostfile (JSON): split the target's layers across its hosts over"
        " MLX's distributed backend (--distributed-backend), the first host rank 0 (the drafter, the policy and this gateway,"
        " one request at a time); run outside mlx.launch, serve starts the ranks through it"
        " (SERVER.md, Distributed target)",
    )
    distributed_backend: Literal["ring", "jaccl"] | None = Field(
        default=None,
        description="MLX backend the --distributed ranks join: ring (TCP over Ethernet or a"
        " Thunderbolt bridge) or jaccl (RDMA over Thunderbolt 5, macOS 26.2+; not tested by"
        ' this project); unset: the hostfile\'s "backend", else ring, as mlx.launch reads it',
    )
    local_model: bool = Field(
        default=True,
        description="load a local model; --no-local-model serves only the --upstreams pools",
        json_schema_extra={"flag": "no-local-model"},
    )


# Every `toolflash serve` setting, in the order `--help`, `--defaults` and SETTINGS.md list them.
SECTIONS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("Server", ServeSettings),
    ("Requests and limits", GatewayConfig),
    ("Prefix cache", CacheConfig),
)
