"""What a snapshot is valid for: the identity of everything that produced its state."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import cached_property

# Bump when the on-disk layout of a snapshot changes (not with the package version).
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SnapshotKey:
    """A snapshot is reusable only by a session with an identical key: same target and
    drafter, same feature layers, same drafter context window (a context trimmed to
    sink + window is not valid for another window), same chat template, same dtype."""

    target_id: str
    draft_id: str | None
    target_layer_ids: tuple[int, ...]
    draft_sink: int | None
    draft_window: int | None
    template_hash: str
    dtype: str
    schema: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> SnapshotKey:
        ids = d.get("target_layer_ids") or []
        if not isinstance(ids, list):
            raise ValueError("target_layer_ids is not a list")
        return cls(
            target_id=str(d["target_id"]),
            draft_id=None if d.get("draft_id") is None else str(d["draft_id"]),
            target_layer_ids=tuple(int(i) for i in ids),
            draft_sink=None if d.get("draft_sink") is None else int(str(d["draft_sink"])),
            draft_window=None if d.get("draft_window") is None else int(str(d["draft_window"])),
            template_hash=str(d["template_hash"]),
            dtype=str(d["dtype"]),
            schema=int(str(d.get("schema", -1))),
        )

    @cached_property
    def digest(self) -> str:
        # Cached: every lookup and publish asks (7 times a request, ~0.1 ms each uncached).
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:32]

    def mismatch(self, other: SnapshotKey) -> list[str]:
        """Names of the fields that differ (empty when the keys are equal)."""
        a, b = self.to_json(), other.to_json()
        return [k for k in a if a[k] != b.get(k)]


def template_hash(template: str | None) -> str:
    """A short stable hash of a chat template (a template change invalidates snapshots)."""
    return hashlib.sha256((template or "").encode()).hexdigest()[:16]
