"""Persist learned estimates to a small JSON file so a restarted server does not relearn.

One file may hold several models' estimates (`{"format": ..., "version": 1, "models": {id: ...}}`).
Saving rewrites only this model's section, atomically (temporary file + `os.replace`). A missing,
corrupt or foreign file is logged and ignored: the server then starts from scratch, never fails.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import structlog

from .estimates import Estimates

log = structlog.get_logger(__name__)

FORMAT = "toolflash-policy-state"
VERSION = 1


class PolicyStore:
    """Reads and writes one state file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()

    def _read(self) -> dict[str, Any] | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("policy.state_unreadable", path=str(self.path), error=str(exc))
            return None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            log.warning("policy.state_corrupt", path=str(self.path), error=str(exc))
            return None
        if (
            not isinstance(doc, dict)
            or doc.get("format") != FORMAT
            or doc.get("version") != VERSION
            or not isinstance(doc.get("models"), dict)
        ):
            log.warning("policy.state_foreign", path=str(self.path))
            return None
        return doc

    def load(self, model_id: str, estimates: Estimates) -> int:
        """Merge this model's saved estimates into `estimates`; returns how many were loaded."""
        doc = self._read()
        if doc is None:
            return 0
        section = doc["models"].get(model_id)
        if section is None:
            return 0
        try:
            if not isinstance(section, dict):
                raise ValueError("model section is not a mapping")
            n = estimates.load_json(section)
        except (ValueError, TypeError) as exc:
            log.warning("policy.state_corrupt", path=str(self.path), model=model_id, error=str(exc))
            return 0
        log.info("policy.state_loaded", path=str(self.path), model=model_id, entries=n)
        return n

    def save(self, model_id: str, estimates: Estimates) -> bool:
        """Write this model's estimates (keeping other models' sections); False on failure."""
        doc = self._read() or {"format": FORMAT, "version": VERSION, "models": {}}
        doc["models"][model_id] = estimates.to_json()
        try:
            self._write(doc)
        except OSError as exc:
            log.warning("policy.state_not_saved", path=str(self.path), error=str(exc))
            return False
        return True

    def saved(self) -> dict[str, int]:
        """Model id -> saved estimate rows (what `toolflash policy show` and `doctor` report)."""
        doc = self._read()
        if doc is None:
            return {}
        return {
            model: sum(len(rows) for rows in section.values() if isinstance(rows, list))
            if isinstance(section, dict)
            else 0
            for model, section in doc["models"].items()
        }

    def forget(self, model_id: str | None = None) -> list[str]:
        """Remove one model's saved estimates (every model's with None), keeping the rest;
        returns the ids removed. Raises OSError when the file cannot be rewritten."""
        doc = self._read()
        if doc is None:
            return []
        models = doc["models"]
        removed = sorted(models) if model_id is None else [m for m in (model_id,) if m in models]
        for model in removed:
            del models[model]
        if removed:
            self._write(doc)
        return removed

    def _write(self, doc: dict[str, Any]) -> None:
        """Replace the file atomically (temporary file + `os.replace`)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".policy-state.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, separators=(",", ":"))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
