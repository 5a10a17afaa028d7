"""L2: snapshots on disk (safetensors + JSON metadata with a checksum), true LRU under a byte
budget, written by a background thread so no decode step ever waits on the disk.

Files are `<id>.safetensors` and `<id>.json`, both written to temporary names and renamed
(data first, metadata last: an entry exists only once both are complete), so several processes
can share one directory. A metadata file that is not, field by field, one of this schema
(`l2_meta.py`), or whose data fails its checksum or decode, is quarantined: both files move to
`quarantine/` (kept for a post-mortem, bounded) and `stats["quarantined"]` counts them (in
/metrics). Nothing a file holds is ever raised: start-up and lookups go on without it.

`close()` drains the writer's queue within a bound, joins the writer and turns later puts into
no-ops; it also runs at interpreter exit (the writer is a daemon thread: killed inside MLX's
save at exit, it aborted the process with `terminate called without an active exception`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import structlog

from .codec import SnapshotFormatError, decode, encode
from .config import CLOSE_TIMEOUT_S
from .key import SnapshotKey
from .l2_meta import MAX_META_BYTES, DiskMeta, parse_meta
from .snapshot import Snapshot, is_prefix

log = structlog.get_logger(__name__)

_STOP = object()
# Longest a queued write waits for a prefill to finish (so a stream of requests cannot starve
# the disk tier forever).
_MAX_DEFER_S = 30.0
# A write starts only once the engine has been out of prefill this long: an agent's next turn
# often arrives right after the last one ends, and a write it catches mid-way cannot be paused
# inside one array save; a tool call's own run time is the usual quiet gap.
_QUIET_S = 0.5
# Files kept in `quarantine/` (the oldest go first).
_QUARANTINE_KEEP = 256


@dataclass
class _Entry:
    ident: str
    key_digest: str
    tokens: tuple[int, ...]
    nbytes: int
    last_used: float


def snapshot_id(key: SnapshotKey, tokens: tuple[int, ...]) -> str:
    h = hashlib.sha256(key.digest.encode())
    h.update(json.dumps(tokens).encode())
    return h.hexdigest()[:40]


def _sha256(path: Path, gate: threading.Event | None = None, max_wait_s: float = 0.0) -> str:
    """The file's SHA-256, read in 1 MB blocks. With `gate`, each block first waits for it
    (at most `max_wait_s` in all): a write already hashing when a prefill starts yields the
    CPU between blocks instead of competing with the prefill to the end."""
    h = hashlib.sha256()
    deadline = time.monotonic() + max_wait_s
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            if gate is not None and not gate.is_set():
                gate.wait(max(0.0, deadline - time.monotonic()))
            h.update(block)
    return h.hexdigest()


def _lower_thread_priority() -> None:
    """Run the calling thread at the lowest CPU priority where the OS allows it per thread
    (Linux): on a machine with few cores the disk writer's serialisation and checksums then
    yield to prefill and decode instead of stretching the next request's TTFT."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError as exc:  # containers may forbid it; writes still happen, just not niced
        log.debug("l2_writer_priority_unchanged", error=str(exc))


class DiskCache:
    """The disk tier. `put` only enqueues; a writer thread does the I/O."""

    def __init__(self, directory: str | Path, max_bytes: int = 8 << 30):
        self.dir = Path(directory).expanduser()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.stats: dict[str, int] = {
            "writes": 0,
            "write_errors": 0,
            "quarantined": 0,
            "verified": 0,
            "evictions": 0,
            "dropped_at_close": 0,
        }
        self._index: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._scanned_mtime = -1.0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=64)
        # Cleared while the engine prefills: writes wait, so on a machine with few cores the
        # serialisation and checksums of the last request's snapshots do not compete with the
        # next request's prefill (its TTFT).
        self._idle = threading.Event()
        self._idle.set()
        self._idle_since = time.monotonic()
        self._shutting_down = False
        # `_closed` turns puts into no-ops (checked with the enqueue under `_close_lock`, so no
        # put lands behind the stop marker); `_abandon` makes the writer drop what is still
        # queued once close's bound is hit.
        self._close_lock = threading.Lock()
        self._closed = False
        self._abandon = threading.Event()
        # Snapshots found on disk whose data has not been checksummed yet: the writer checks
        # them while idle (start-up validates metadata at once, data in the background).
        self._unverified: deque[str] = deque()
        self._writer = threading.Thread(target=self._write_loop, name="toolflash-l2", daemon=True)
        self._writer.start()
        # The writer thread keeps `self` alive anyway, so a strong reference costs nothing;
        # close() unregisters it.
        atexit.register(self.close)
        self._rescan()

    # -- paths and index ---------------------------------------------------------------
    def _data(self, ident: str) -> Path:
        return self.dir / f"{ident}.safetensors"

    def _meta(self, ident: str) -> Path:
        return self.dir / f"{ident}.json"

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._index.values())

    def __len__(self) -> int:
        return len(self._index)

    def _rescan(self) -> None:
        """Bring the index up to the directory when it changed (a write, a removal, another
        process). Entries already indexed are not reparsed (a snapshot's files never change
        under its id), only their last use is refreshed from the metadata file's mtime (the
        LRU that processes share); new metadata files are read. Every lookup calls this, and
        each request's own snapshot writes change the directory."""
        try:
            mtime = self.dir.stat().st_mtime
        except OSError:
            return
        if mtime == self._scanned_mtime:
            return
        present = {path.stem: path for path in self.dir.glob("*.json")}
        with self._lock:
            known = dict(self._index)
        index: dict[str, _Entry] = {}
        for ident, meta_path in present.items():
            entry = known.get(ident)
            if entry is None:
                entry = self._read_entry(meta_path)
                if entry is not None:
                    self._unverified.append(ident)
            else:
                try:
                    entry.last_used = meta_path.stat().st_mtime
                except FileNotFoundError:
                    entry = None  # a concurrent remove
                except OSError:
                    pass  # keep the last use it had
            if entry is not None:
                index[ident] = entry
        with self._lock:
            self._index = index
            self._scanned_mtime = mtime

    def _read_entry(self, meta_path: Path) -> _Entry | None:
        ident = meta_path.stem
        try:
            meta = self._read_meta(ident)
            size = self._data(ident).stat().st_size
            if size != meta.file_bytes:
                raise SnapshotFormatError("data size does not match the metadata")
            return _Entry(ident, meta.key.digest, meta.tokens, size, meta_path.stat().st_mtime)
        except FileNotFoundError:
            # Metadata is written last and removed first: with it still there, missing data
            # is damage, not a write or a remove in progress.
            if meta_path.exists():
                self._quarantine(ident, "metadata without its data file")
            return None
        except Exception as exc:  # whatever a file holds, start-up and lookups go on
            self._quarantine(ident, f"metadata: {type(exc).__name__}: {exc}")
            return None

    def _read_meta(self, ident: str) -> DiskMeta:
        path = self._meta(ident)
        if path.stat().st_size > MAX_META_BYTES:
            raise SnapshotFormatError("metadata file too large")
        return parse_meta(path.read_text(), ident, snapshot_id)

    def _remove(self, ident: str, reason: str) -> None:
        for path in (self._meta(ident), self._data(ident)):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("l2_remove_failed", path=str(path), error=str(exc))
        with self._lock:
            self._index.pop(ident, None)
        log.info("l2_removed", id=ident, reason=reason)

    def _quarantine(self, ident: str, reason: str) -> None:
        """Move a snapshot's files aside into `quarantine/` (removed where they cannot be
        moved), so they are never read again and stay for a look; the oldest quarantined
        files go past `_QUARANTINE_KEEP`."""
        qdir = self.dir / "quarantine"
        moved = False  # counted once, also when a lookup and the verifier meet the same file
        try:
            qdir.mkdir(exist_ok=True)
            for path in (self._meta(ident), self._data(ident)):
                try:
                    os.replace(path, qdir / path.name)
                    moved = moved or path.suffix == ".json"
                except FileNotFoundError:
                    pass
            kept = sorted(qdir.iterdir(), key=lambda p: p.stat().st_mtime)
            for old in kept[: max(0, len(kept) - _QUARANTINE_KEEP)]:
                old.unlink()
        except OSError as exc:  # a read-only or odd directory: remove instead
            log.warning("l2_quarantine_failed", id=ident, error=str(exc))
            self._remove(ident, reason)
            moved = True
        with self._lock:
            self._index.pop(ident, None)
        if moved:
            self.stats["quarantined"] += 1
            log.warning("l2_quarantined", id=ident, reason=reason)

    def _verify_one(self) -> None:
        """Checksum one snapshot found on disk (the writer's idle work, only while the engine
        is quiet); a mismatch is quarantined now rather than at the lookup that needs it."""
        if not self._unverified or not self._idle.is_set():
            return
        if time.monotonic() - self._idle_since < _QUIET_S:
            return
        ident = self._unverified.popleft()
        with self._lock:
            if ident not in self._index:
                return
        try:
            meta = self._read_meta(ident)
            if _sha256(self._data(ident), self._idle, _MAX_DEFER_S) != meta.checksum:
                raise SnapshotFormatError("checksum mismatch")
        except FileNotFoundError:
            return  # removed meanwhile (evicted, quarantined by a lookup, another process)
        except Exception as exc:
            self._quarantine(ident, f"data: {type(exc).__name__}: {exc}")
            return
        self.stats["verified"] += 1

    # -- lookup ------------------------------------------------------------------------
    def lookup(
        self, key: SnapshotKey, tokens: tuple[int, ...] | list[int], min_tokens: int = 0
    ) -> Snapshot | None:
        """The longest valid snapshot with this key that is a prefix of `tokens` and covers
        at least `min_tokens` tokens."""
        self._rescan()
        with self._lock:
            candidates = sorted(
                (
                    e
                    for e in self._index.values()
                    if e.key_digest == key.digest
                    and len(e.tokens) >= min_tokens
                    and is_prefix(e.tokens, tokens)
                ),
                key=lambda e: -len(e.tokens),
            )
        for entry in candidates:
            snapshot = self._load(entry)
            if snapshot is not None:
                return snapshot
        return None

    def _load(self, entry: _Entry) -> Snapshot | None:
        meta_path, data_path = self._meta(entry.ident), self._data(entry.ident)
        try:
            # Read again: the file may have changed since it was indexed.
            meta = self._read_meta(entry.ident)
            if meta.tokens != entry.tokens or _sha256(data_path) != meta.checksum:
                raise SnapshotFormatError("checksum mismatch")
            arrays = mx.load(str(data_path))
            if not isinstance(arrays, dict):
                raise SnapshotFormatError("data is not a set of named arrays")
            snapshot = decode(arrays, meta.raw)
            if snapshot.key.digest != entry.key_digest:
                raise SnapshotFormatError("key does not match the index")
        except FileNotFoundError:
            with self._lock:
                self._index.pop(entry.ident, None)
            return None
        except Exception as exc:  # whatever a file holds, the lookup is a miss, not a failure
            self._quarantine(entry.ident, f"data: {type(exc).__name__}: {exc}")
            return None
        now = time.time()
        try:
            os.utime(meta_path, (now, now))  # LRU survives restarts and is shared by processes
        except OSError:
            pass
        entry.last_used = now
        return snapshot

    # -- writes ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, snapshot: Snapshot) -> bool:
        """Queue a snapshot for writing; False when the writer is saturated or the cache is
        closed (dropped)."""
        if self._closed:
            return False
        mx.eval(*snapshot.state.arrays())
        with self._close_lock:
            if self._closed:
                return False
            try:
                self._queue.put_nowait(snapshot)
                return True
            except queue.Full:
                log.warning("l2_queue_full", tokens=len(snapshot.tokens))
                return False

    def pause(self) -> None:
        """Hold back writes not yet started (the engine is on a latency-critical path)."""
        self._idle.clear()

    def resume(self) -> None:
        self._idle_since = time.monotonic()
        self._idle.set()

    def _wait_quiet(self, max_wait_s: float) -> None:
        """Block until the engine has been out of prefill for `_QUIET_S` (at most
        `max_wait_s` in all; no wait once closing)."""
        deadline = time.monotonic() + max_wait_s
        while not self._shutting_down and (left := deadline - time.monotonic()) > 0:
            if not self._idle.wait(left):
                return
            quiet_for = time.monotonic() - self._idle_since
            if quiet_for >= _QUIET_S:
                return
            time.sleep(min(_QUIET_S - quiet_for, max(0.0, deadline - time.monotonic())))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued snapshot is written (tests, shutdown)."""
        deadline = time.time() + timeout
        while self._queue.unfinished_tasks and time.time() < deadline:
            time.sleep(0.005)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is queued (waiting at most `timeout` seconds), stop and join the writer;
        later puts are no-ops. Idempotent. When the bound is hit, the snapshots not yet written
        are dropped (logged as `l2_close_timeout`; a write in progress may still finish, or
        leave only temporary files, which are never read)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self._shutting_down = True
        self._idle.set()  # shutting down: no prefill to make way for
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
            stop_queued = True
        except queue.Full:  # the writer is stuck on one write; `_abandon` below ends it
            stop_queued = False
        self._writer.join(max(0.0, deadline - time.monotonic()))
        if self._writer.is_alive():
            self._abandon.set()
            pending = self._queue.qsize()
            log.warning(
                "l2_close_timeout",
                timeout_s=timeout,
                dropped=pending - stop_queued,  # the stop marker is no write
                write_in_progress=self._queue.unfinished_tasks > pending,
                directory=str(self.dir),
            )
        else:
            log.debug("l2_closed", writes=self.stats["writes"], directory=str(self.dir))

    def _write_loop(self) -> None:
        _lower_thread_priority()
        while True:
            try:
                # A timeout, so an abandoned writer whose stop marker found the queue full
                # still ends once the queue is empty.
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                if self._abandon.is_set():
                    return
                if not self._shutting_down:
                    try:
                        self._verify_one()
                    except Exception as exc:  # never let a check end the writer
                        log.error("l2_verify_failed", error=str(exc))
                continue
            try:
                if item is _STOP:
                    return
                if self._abandon.is_set():  # close() gave up waiting: drop, do not write
                    self.stats["dropped_at_close"] += 1
                    continue
                self._wait_quiet(_MAX_DEFER_S)
                self._write(item)
            except Exception as exc:  # the writer must survive anything one snapshot does
                self.stats["write_errors"] += 1
                log.error("l2_write_failed", error=str(exc))
            finally:
                self._queue.task_done()

    def _write(self, snapshot: Snapshot) -> None:
        ident = snapshot_id(snapshot.key, snapshot.tokens)
        if self._meta(ident).exists():
            return
        arrays, meta = encode(snapshot)
        suffix = f".{os.getpid()}.{threading.get_ident()}.tmp"
        tmp_data = self.dir / f"{ident}{suffix}.safetensors"
        tmp_meta = self.dir / f"{ident}{suffix}.json.part"
        try:
            # The queue wait saw the engine idle, but a prefill may have started since.
            self._idle.wait(_MAX_DEFER_S)
            mx.save_safetensors(str(tmp_data), arrays)
            meta["checksum"] = _sha256(tmp_data, self._idle, _MAX_DEFER_S)
            meta["file_bytes"] = tmp_data.stat().st_size
            tmp_meta.write_text(json.dumps(meta))
            os.replace(tmp_data, self._data(ident))
            os.replace(tmp_meta, self._meta(ident))
        except OSError as exc:  # disk full, permissions: drop this snapshot, keep serving
            for path in (tmp_data, tmp_meta):
                try:
                    path.unlink()
                except OSError:
                    pass
            self.stats["write_errors"] += 1
            log.warning("l2_write_failed", error=str(exc), tokens=len(snapshot.tokens))
            return
        with self._lock:
            self._index[ident] = _Entry(
                ident, snapshot.key.digest, snapshot.tokens, int(meta["file_bytes"]), time.time()
            )
        self.stats["writes"] += 1
        self._evict()

    def _evict(self) -> None:
        while True:
            with self._lock:
                total = sum(e.nbytes for e in self._index.values())
                if total <= self.max_bytes or not self._index:
                    return
                victim = min(self._index.values(), key=lambda e: e.last_used)
            self._remove(victim.ident, "evicted")
            self.stats["evictions"] += 1
