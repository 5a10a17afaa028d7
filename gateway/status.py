"""The live view behind GET /v1/status: the running request and the last 32 finished ones."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from toolflash.gateway.record import RequestRecord, status_row
from toolflash.gateway.worker import EngineWorker

RECENT = 32


class LiveStatus:
    """Thread-safe ring of recent requests plus a reader for the worker's current job."""

    def __init__(self, worker: EngineWorker) -> None:
        self._worker = worker
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._lock = threading.Lock()
        self.started_at = time.time()

    def add(self, record: RequestRecord) -> None:
        row = status_row(record)
        with self._lock:
            self._recent.append(row)

    def snapshot(self) -> dict[str, Any]:
        w = self._worker
        job = w.current
        current = None
        if job is not None:
            now = time.perf_counter()
            started = job.started_at or now
            prep = job.prepared
            current = {
                "id": job.id,
                "request_class": prep.request_class.label if prep else None,
                "mode": job.mode,
                "prompt_tokens": len(prep.request.prompt_tokens) if prep else None,
                "completion_tokens": job.tokens,
                "running_s": round(now - started, 4),
                "cancelled": job.cancel.is_set(),
            }
        engine = w.engine
        with self._lock:
            recent = list(reversed(self._recent))
        return {
            "state": w.state,
            "model": engine.model_id if engine else None,
            "draft": engine.draft_id if engine else None,
            "context_length": engine.context_length if engine else None,
            "uptime_s": round(time.time() - self.started_at, 1),
            "queue": {"waiting": w.waiting, "running": w.running, "limit": w.max_queue},
            "current": current,
            "recent": recent,
        }
