"""The calibration record: which model ran `toolflash calibrate` on which machine, and what it found.

Calibration measures the pair with scripted generations (`toolflash/calibrate.py`) into a fresh
`Estimates`, seeds the policy's estimates with them (`seed`) and saves those through the
`PolicyStore` like any learned estimates. This module keeps the record that it ran: one small
JSON file per (model, drafter, machine) under `<state_dir>/calibration/`, holding the full
`CalibrationKey` (weights fingerprint, machine, MLX / mlx-lm / toolflash versions) and the table
of what was measured. A record whose key differs from the current one (new weights, an MLX
upgrade) is stale: logged and ignored, so the server calibrates again. A missing, corrupt or
foreign file is logged and ignored the same way; nothing here ever fails a server.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from .estimates import POOL, Estimates

log = structlog.get_logger(__name__)

FORMAT = "toolflash-calibration"
VERSION = 1


@dataclass(frozen=True)
class CalibrationKey:
    """What a calibration is valid for: the pair (ids and a fingerprint of its weight files),
    the machine (platform, CPU, MLX device, BLAS) and the software that decodes."""

    model: str
    draft: str | None
    weights: str
    machine: Mapping[str, str] = field(default_factory=dict)
    mlx: str = ""
    mlx_lm: str = ""
    toolflash: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "draft": self.draft,
            "weights": self.weights,
            "machine": dict(self.machine),
            "mlx": self.mlx,
            "mlx_lm": self.mlx_lm,
            "toolflash": self.toolflash,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CalibrationKey:
        machine = d.get("machine")
        if not isinstance(d.get("model"), str) or not isinstance(machine, dict):
            raise ValueError("bad calibration key")
        return cls(
            model=d["model"],
            draft=d.get("draft"),
            weights=str(d.get("weights", "")),
            machine={str(k): str(v) for k, v in machine.items()},
            mlx=str(d.get("mlx", "")),
            mlx_lm=str(d.get("mlx_lm", "")),
            toolflash=str(d.get("toolflash", "")),
        )

    def differences(self, other: CalibrationKey) -> list[str]:
        """The fields (machine fields as `machine.<name>`) where `other` differs."""
        mine, theirs = self.as_dict(), other.as_dict()
        out = [k for k in mine if k != "machine" and mine[k] != theirs[k]]
        names = sorted(set(self.machine) | set(other.machine))
        out += [f"machine.{n}" for n in names if self.machine.get(n) != other.machine.get(n)]
        return out


@dataclass(frozen=True)
class CalibrationRecord:
    """One calibration: its key, when it ran and for how long, and the rows of what it
    measured (JSON-able dicts, as `toolflash calibrate` prints them)."""

    key: CalibrationKey
    created: float
    wall_s: float
    rows: tuple[Mapping[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "key": self.key.as_dict(),
            "created": self.created,
            "wall_s": self.wall_s,
            "rows": [dict(r) for r in self.rows],
        }

    @classmethod
    def from_dict(cls, d: Any) -> CalibrationRecord:
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ValueError("not a toolflash calibration record of this version")
        rows = d.get("rows", [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError("rows: not a list of objects")
        return cls(
            key=CalibrationKey.from_dict(d.get("key") or {}),
            created=float(d["created"]),
            wall_s=float(d["wall_s"]),
            rows=tuple(rows),
        )


def record_dir(state_dir: str | Path) -> Path:
    return Path(state_dir).expanduser() / "calibration"


def record_path(state_dir: str | Path, key: CalibrationKey) -> Path:
    """The record's file: named by the model, with a hash of (model, drafter, machine), so
    another drafter or machine sharing the state directory has its own file, and a version
    change finds the old record (and says it is stale) rather than none."""
    ident = json.dumps([key.model, key.draft, dict(sorted(key.machine.items()))])
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", key.model.rstrip("/").rsplit("/", 1)[-1])[:64]
    return record_dir(state_dir) / f"{name}-{digest}.json"


def read_record(path: Path) -> CalibrationRecord | None:
    """The record in `path`, or None (missing: silently; unreadable or corrupt: logged)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("calibration.unreadable", path=str(path), error=str(exc))
        return None
    try:
        return CalibrationRecord.from_dict(json.loads(text))
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("calibration.corrupt", path=str(path), error=str(exc))
        return None


def load_record(state_dir: str | Path, key: CalibrationKey) -> CalibrationRecord | None:
    """The valid record for `key`, or None: none yet, unreadable, or stale (made for other
    weights, another machine or other versions; logged with the fields that differ)."""
    path = record_path(state_dir, key)
    record = read_record(path)
    if record is None:
        return None
    changed = record.key.differences(key)
    if changed:
        log.warning(
            "calibration.stale",
            path=str(path),
            model=key.model,
            changed=changed,
            detail="made for other weights, machine or versions: calibrating again",
        )
        return None
    return record


def save_record(state_dir: str | Path, record: CalibrationRecord) -> Path | None:
    """Write the record atomically; its path, or None on failure (logged)."""
    path = record_path(state_dir, record.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".calibration.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record.as_dict(), f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        log.warning("calibration.not_saved", path=str(path), error=str(exc))
        return None
    return path


def records_for(state_dir: str | Path, model: str) -> list[tuple[Path, CalibrationRecord]]:
    """Every readable record of `model` in the state directory (any drafter or machine)."""
    found = []
    root = record_dir(state_dir)
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        record = read_record(path)
        if record is not None and record.key.model == model:
            found.append((path, record))
    return found


# Estimates of this machine's speed (seconds per cycle, per AR step, per forced run); the rest
# (tokens per cycle, forced-run shares) depend on what is generated.
_TIMING_TABLES = ("cycle_s", "ar_s", "cycle_scope_s", "ar_scope_s", "forced_block_s")


def seed(target: Estimates, measured: Estimates, timing_weight: float, tau_weight: float) -> int:
    """Merge calibration's estimates into `target`, replacing the same keys; returns how many.

    Calibration samples are real samples of this machine, measured by the rule online
    learning uses, each estimate keeping at most a few effective samples (mean and spread
    unchanged). Timings are the machine's, and calibration measures them well: own samples,
    at most `timing_weight`. Tokens per cycle are the workload's, and the built-in prompts
    only a guess at it: a class's tau goes in as that class's prior (`Estimates.prior_tau`,
    read like the pooled priors: at most `PRIOR_SAMPLES` samples and 0 own ones, so the
    class's first requests decide on it, its own traffic is still probed, and its first own
    cycles replace it); lookup's tokens and seconds per step likewise only as the pools of
    each span. Seeded as own samples, a low guess made spec look hopeless where the
    class's traffic paid (forced tool calls of the agent workload: calibrated 0.77x of the
    better fixed mode against 0.95x without calibration), since probes skip an arm whose
    measured tau cannot win. Forced-run shares stay own samples, at most `tau_weight`.
    Estimates of keys calibration did not measure (other classes) are kept."""
    doc = measured.to_json()
    tau = doc.pop("tau", [])
    doc["tau"] = [row for row in tau if row[1] == POOL]  # the pools are priors already
    doc["prior_tau"] = [row for row in tau if row[1] != POOL]
    # Lookup likewise: the span's pool is a prior when read; a class's own rows would not be.
    for name in ("lookup_tokens", "lookup_s", "lookup_requests"):
        doc[name] = [row for row in doc.get(name, []) if row[1] == POOL]
    for name, rows in doc.items():
        cap = timing_weight if name in _TIMING_TABLES else tau_weight
        for row in rows:
            weight = row[-5]
            if weight > cap > 0:
                k = cap / weight
                row[-5], row[-4], row[-3] = cap, row[-4] * k, row[-3] * k
    return target.load_json(doc)
