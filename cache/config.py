"""Prefix-cache settings, each declared once: `toolflash serve` derives its `--cache-*` flags,
their help and the settings reference (SETTINGS.md) from these fields (`flag` names the flag
where it differs from the field; `scale` converts the flag's unit to the field's)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MB = 1 << 20
# Default bound on how long closing the disk tier waits for queued writes (server shutdown,
# process exit); `DiskCache.close` takes it too.
CLOSE_TIMEOUT_S = 5.0


class CacheConfig(BaseModel):
    """Budgets and placement of the prefix cache (L1 in RAM, optional L2 on disk)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        default=True,
        description="reuse the longest cached prompt prefix (--no-cache turns it off)",
        json_schema_extra={"flag": "no-cache"},
    )
    l1_entries: int = Field(
        default=32,
        ge=0,
        description="L1 (RAM) snapshot entries",
        json_schema_extra={"flag": "cache-entries"},
    )
    l1_bytes: int = Field(
        default=2048 * MB,
        ge=0,
        description="L1 (RAM) byte budget (MB on the command line)",
        json_schema_extra={"flag": "cache-ram-mb", "scale": MB},
    )
    l2_dir: str | None = Field(
        default=None,
        description="L2 (disk) snapshot directory; unset: no disk tier",
        json_schema_extra={"flag": "cache-dir"},
    )
    l2_bytes: int = Field(
        default=8192 * MB,
        ge=0,
        description="L2 (disk) byte budget (MB on the command line)",
        json_schema_extra={"flag": "cache-disk-mb", "scale": MB},
    )
    l2_close_timeout_s: float = Field(
        default=CLOSE_TIMEOUT_S,
        ge=0.0,
        description="how long closing (server shutdown, process exit) waits for queued disk writes",
        json_schema_extra={"flag": False},
    )
    # Loading reads and checksums the whole snapshot, so a gain of a few tokens costs more than
    # computing them.
    l2_min_gain_tokens: int = Field(
        default=256,
        ge=0,
        description="read a disk snapshot instead of a RAM hit when it covers at least this many"
        " more prompt tokens",
        json_schema_extra={"flag": "cache-disk-min-gain"},
    )
