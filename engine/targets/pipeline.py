"""A target whose decoder layers are split across processes (pipeline parallel, mx.distributed).

Rank 0 holds the embedding, the final norm and lm_head (the drafter borrows them), its own slice
of layers, and everything above the target (session, drafter, policy, gateway). `PipelineTarget`
is a `TargetAdapter`: the session calls it exactly as it calls a single-process target. Every
other rank runs `serve_stage` over its slice. The ranks form a ring (0 -> 1 -> ... -> n-1 -> 0,
MLX's ring backend connects neighbours): a command goes round it first, then, for a forward,
the hidden states follow it, each rank running its layers, and the last rank hands the result
back to rank 0. A forward (a prefill chunk, an AR step, a verify block) crosses the pipeline
once, whatever its rows.

What comes back to rank 0 is one array: the last layer's output, then the outputs of the
captured layers held by ranks 1..n-1 (the drafter's target features), concatenated on the last
axis. Each rank keeps its caches per session (by cache id) and the rollback tape of each
cache's last forward, so a rollback is one command: trim the K/V, restore GatedDeltaNet state.

Every array crossing the ring is evaluated right away, in command order: the ranks read them in
the order they were sent, and a lazily pending receive overtaken by the next one would read
the wrong bytes. A lost peer makes MLX's ring raise at once ("connection to a peer was lost");
rank 0 turns that into `PipelineError` and refuses every later call with it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import structlog

from toolflash.cache.state import LayerState, export_cache, restore_cache

from ..api import EngineError
from .base import ForwardResult, features_in_order
from .pipeline_ring import Ring, RingGroup, RingTimeout

log = structlog.get_logger(__name__)

FORWARD, ROLLBACK, NEW_CACHE, FREE_CACHE, STOP = 1, 2, 3, 4, 5
SNAPSHOT, RESTORE, DROP_SNAPSHOT = 6, 7, 8
# Hidden-state dtypes a payload may have (the header carries the index).
DTYPES = (mx.float32, mx.float16, mx.bfloat16)
HEADER_WORDS = 64
_FIXED = 8  # header words before the captured layer ids


class PipelineError(EngineError):
    """A rank of the pipeline is gone (or answered nonsense): the target cannot run."""


@dataclass(frozen=True)
class Command:
    """One instruction that goes round the ring (a fixed-size int32 header on the wire)."""

    op: int
    cache_id: int = 0
    tokens: int = 0  # rows of this forward, or of the forward a rollback undoes
    keep: int = 0  # rollback: rows to keep; snapshots: the snapshot id
    keep_tape: bool = False
    last_only: bool = False
    shift: int = 0  # position_shift
    dtype: int = 0  # index in DTYPES
    capture: tuple[int, ...] = ()

    def encode(self) -> mx.array:
        words = [
            self.op,
            self.cache_id,
            self.tokens,
            self.keep,
            int(self.keep_tape),
            int(self.last_only),
            self.shift,
            self.dtype,
        ]
        if len(self.capture) > HEADER_WORDS - _FIXED - 1:
            raise ValueError(f"at most {HEADER_WORDS - _FIXED - 1} captured layers")
        words += [len(self.capture), *self.capture]
        return mx.array(words + [0] * (HEADER_WORDS - len(words)), dtype=mx.int32)

    @classmethod
    def decode(cls, header: mx.array) -> Command:
        w = [int(x) for x in cast(list[int], header.tolist())]
        n = w[_FIXED]
        return cls(
            op=w[0],
            cache_id=w[1],
            tokens=w[2],
            keep=w[3],
            keep_tape=bool(w[4]),
            last_only=bool(w[5]),
            shift=w[6],
            dtype=w[7],
            capture=tuple(w[_FIXED + 1 : _FIXED + 1 + n]),
        )


def split_layers(num_layers: int, ranks: int) -> list[range]:
    """Contiguous layer slices, one per rank, as even as possible (the earlier ranks get one
    fewer when they do not divide: rank 0 also runs the embedding, the head and the drafter)."""
    if ranks < 1 or num_layers < ranks:
        raise ValueError(f"cannot split {num_layers} layers across {ranks} ranks")
    base, extra = divmod(num_layers, ranks)
    sizes = [base + (1 if r >= ranks - extra else 0) for r in range(ranks)]
    starts = [sum(sizes[:r]) for r in range(ranks)]
    return [range(s, s + n) for s, n in zip(starts, sizes, strict=True)]


def carried_layers(capture: Sequence[int], slices: Sequence[range], rank: int) -> list[int]:
    """Captured layers whose outputs the payload carries into `rank` (rank 0 keeps its own;
    rank == len(slices) means the result back at rank 0), in layer order."""
    held = [i for s in slices[1:rank] for i in s]
    return sorted(set(capture) & set(held))


def result_rows(cmd: Command, slices: Sequence[range]) -> int:
    """Rows of the result the last rank sends back: only the last one when only the last
    logits are needed and no remote layer is captured."""
    remote = carried_layers(cmd.capture, slices, len(slices))
    return 1 if cmd.last_only and not remote else cmd.tokens


class Stage:
    """One rank's slice of the decoder stack (run through the family adapter's `run_layers`)
    and its per-session caches with the rollback tape of each one's last forward."""

    def __init__(self, adapter: Any, layers: range):
        self.adapter = adapter
        self.layers = layers
        self.caches: dict[int, list[Any]] = {}
        self._tapes: dict[int, tuple[dict[int, Any], int]] = {}
        self.snapshots: dict[int, tuple[LayerState, ...]] = {}

    def new(self, cache_id: int) -> list[Any]:
        """Fresh caches for this slice's layers under `cache_id`."""
        cache = self.adapter.make_cache()[self.layers.start : self.layers.stop]
        self.caches[cache_id] = cache
        return cache

    def free(self, cache_id: int) -> None:
        """Drop `cache_id`'s caches (0: none)."""
        self.caches.pop(cache_id, None)
        self._tapes.pop(cache_id, None)

    def run(self, cmd: Command, h: mx.array) -> tuple[mx.array, list[mx.array]]:
        """This slice's layers on `h` for cache `cmd.cache_id`: the output and the outputs of
        its captured layers."""
        cache = self._cache(cmd.cache_id)
        h, captured, tape = self.adapter.run_layers(
            h, self.layers, cache, cmd.capture, cmd.keep_tape, cmd.shift
        )
        self._tapes[cmd.cache_id] = (tape, cmd.tokens)
        return h, captured

    def rollback(self, cmd: Command) -> None:
        tape, tokens = self._tapes.get(cmd.cache_id, ({}, 0))
        if tokens != cmd.tokens:
            raise PipelineError(
                f"rollback of a {cmd.tokens}-row forward, but cache {cmd.cache_id}'s last "
                f"forward had {tokens} rows"
            )
        self.adapter.rollback_layers(self._cache(cmd.cache_id), tape, tokens, cmd.keep)

    def snapshot(self, cache_id: int, snapshot_id: int) -> tuple[LayerState, ...]:
        """Keep this slice's state of `cache_id` as `snapshot_id` (views: MLX arrays are
        values, later decoding never changes them)."""
        state = export_cache(self._cache(cache_id))
        self.snapshots[snapshot_id] = state
        return state

    def restore(self, cache_id: int, snapshot_id: int) -> None:
        state = self.snapshots.get(snapshot_id)
        if state is None:
            raise PipelineError(f"no snapshot {snapshot_id} on this rank")
        restore_cache(self._cache(cache_id), state)

    def _cache(self, cache_id: int) -> list[Any]:
        cache = self.caches.get(cache_id)
        if cache is None:
            raise PipelineError(f"no cache {cache_id} on this rank")
        return cache


class PipelineCache:
    """A session's target cache on a pipeline: rank 0's layers here, the other ranks' under
    the same id there. The session sees one opaque cache, iterating as itself: `cache_offset`
    reads its `offset` (tokens held). A snapshot (`export_cache`) is rank 0's layers' states
    and one "remote" layer naming the snapshot every other rank keeps of its own layers (no
    transfer; dropped there when the state is garbage); a snapshot restores into any cache of
    the same target. Batch merging refuses it (serve runs a pipeline one request at a time)."""

    def __init__(self, target: PipelineTarget, cache_id: int, local: list[Any]):
        self.target = target
        self.cache_id = cache_id
        self.local = local
        self.offset = 0

    def export_layers(self) -> tuple[LayerState, ...]:
        return self.target.snapshot(self)

    def restore_layers(self, layers: Sequence[LayerState]) -> None:
        self.target.restore(self, layers)

    def __iter__(self) -> Any:
        return iter([self])

    def __len__(self) -> int:
        return 1


class PipelineTarget:
    """Rank 0's `TargetAdapter` over a target split across the ranks of `group`."""

    def __init__(self, adapter: Any, group: RingGroup, slices: Sequence[range] | None = None):
        self.adapter = adapter
        self.family = adapter.family
        self.model = adapter.model
        self.hidden_size = adapter.hidden_size
        self.num_layers = adapter.num_layers
        self.vocab_size = adapter.vocab_size
        self.ring = Ring(group)
        self.timeout_s = group.timeout_s
        if self.ring.rank != 0:
            raise ValueError("PipelineTarget runs on rank 0 (the others run serve_stage)")
        self.slices = list(slices or split_layers(adapter.num_layers, self.ring.size))
        self.stage = Stage(adapter, self.slices[0])
        self._lock = threading.Lock()
        self._next_id = 0
        self._freed: list[Command] = []  # FREE_CACHE / DROP_SNAPSHOT, sent with the next
        self._failure: str | None = None

    @property
    def failure(self) -> str | None:
        """Why the pipeline serves no more (a rank lost, or closed); None while it does. Known
        from the first transfer that failed: a rank that dies while idle is found by the next
        request."""
        return self._failure

    def embed(self, tokens: mx.array) -> mx.array:
        return self.adapter.embed(tokens)

    def lm_head(self, hidden: mx.array) -> mx.array:
        return self.adapter.lm_head(hidden)

    def make_cache(self) -> PipelineCache:
        with self._lock:
            self._next_id += 1
            cache = PipelineCache(self, self._next_id, self.stage.new(self._next_id))
            self._send(Command(NEW_CACHE, cache.cache_id))
        # A session's cache is dropped with the session: the ranks drop theirs with the next
        # command (finalizers may run on any thread, so they only queue the id).
        weakref.finalize(cache, self._freed.append, Command(FREE_CACHE, cache.cache_id))
        return cache

    def snapshot(self, cache: PipelineCache) -> tuple[LayerState, ...]:
        """`cache`'s state: rank 0's layers, then a reference to the other ranks' snapshots
        that carries the bytes they keep (the prefix cache's byte budget counts the whole
        pipeline's share: a total goes round the ring, each rank adding its own)."""
        with self._lock:
            self._next_id += 1
            snapshot_id = self._next_id
            local = export_cache(self.stage.caches[cache.cache_id])
            self._send(Command(SNAPSHOT, cache.cache_id, keep=snapshot_id))
            self._guarded(self.ring.send, mx.array([0], dtype=mx.int64))
            held = self._guarded(self.ring.recv, (1,), mx.int64, self.timeout_s)
        ref = mx.array([snapshot_id, cache.offset], dtype=mx.int32)
        remote = LayerState("remote", (ref,), held_bytes=int(held.item()))
        weakref.finalize(remote, self._freed.append, Command(DROP_SNAPSHOT, keep=snapshot_id))
        return (*local, remote)

    def restore(self, cache: PipelineCache, layers: Sequence[LayerState]) -> None:
        """Load a state `snapshot` exported on this target into `cache` (fresh)."""
        if not layers or layers[-1].kind != "remote" or len(layers) != len(self.slices[0]) + 1:
            raise ValueError("the state was not exported by this pipeline target")
        snapshot_id, offset = (int(x) for x in layers[-1].arrays[0].tolist())
        with self._lock:
            restore_cache(self.stage.caches[cache.cache_id], tuple(layers[:-1]))
            self._send(Command(RESTORE, cache.cache_id, keep=snapshot_id))
        cache.offset = offset

    def forward(
        self,
        tokens: mx.array,
        cache: Any,
        capture: Sequence[int] = (),
        keep_tape: bool = False,
        last_logits_only: bool = False,
        position_shift: int = 0,
    ) -> ForwardResult:
        rows = int(tokens.shape[1])
        with self._lock:
            h = self.adapter.embed(tokens)
            cmd = Command(
                FORWARD,
                cache.cache_id,
                rows,
                keep_tape=keep_tape,
                last_only=last_logits_only,
                shift=position_shift,
                dtype=DTYPES.index(h.dtype),
                capture=tuple(capture),
            )
            self._send(cmd)
            h, own = self.stage.run(cmd, h)
            remote = carried_layers(capture, self.slices, len(self.slices))
            width = self.hidden_size * (1 + len(remote))
            out = self._exchange(h, (1, result_rows(cmd, self.slices), width), h.dtype)
        cache.offset += rows
        h = out[..., : self.hidden_size]
        rest = out[..., self.hidden_size :]
        parts = list(mx.split(rest, len(remote), axis=-1)) if remote else []
        by_layer = dict(zip(sorted(set(capture) & set(self.slices[0])), own, strict=True))
        by_layer.update(zip(remote, parts, strict=True))
        captured = [by_layer[i] for i in sorted(by_layer)]
        return ForwardResult(
            logits=self.adapter.finish(h, last_logits_only),
            features=features_in_order(captured, capture),
            tokens=rows,
        )

    def rollback(self, cache: Any, result: ForwardResult, keep: int) -> None:
        drop = result.tokens - keep
        if drop <= 0:
            return
        cmd = Command(ROLLBACK, cache.cache_id, result.tokens, keep)
        with self._lock:
            self.stage.rollback(cmd)
            self._send(cmd)
        cache.offset -= drop

    def close(self) -> None:
        """Stop the other ranks' serve loops (they exit); the target is unusable after."""
        with self._lock:
            if self._failure is None:
                try:
                    self._send(Command(STOP))
                except PipelineError:
                    return  # a rank is gone already: nothing to stop
                self._failure = "the pipeline was closed"

    # -- the ring ------------------------------------------------------------------------
    def _send(self, cmd: Command) -> None:
        """Send `cmd` round the ring, after the frees that queued up (caller holds the lock)."""
        self._check()
        while self._freed:
            freed = self._freed.pop()
            self.stage.free(freed.cache_id)
            self._guarded(self._send_command, freed)
        self._guarded(self._send_command, cmd)

    def _exchange(self, h: mx.array, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
        self._guarded(self.ring.send, h)
        out: mx.array = self._guarded(self.ring.recv, shape, dtype, self.timeout_s)
        return out

    def _send_command(self, cmd: Command) -> None:
        self.ring.send(cmd.encode())

    def _guarded(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (RuntimeError, RingTimeout) as exc:
            self._failure = f"pipeline rank lost: {exc}"
            log.error("pipeline.failed", detail=str(exc), ranks=self.ring.size)
            raise PipelineError(self._failure) from exc

    def _check(self) -> None:
        if self._failure is not None:
            raise PipelineError(self._failure)


def serve_stage(stage: Stage, ring: Ring, slices: Sequence[range], hidden: int) -> None:
    """A non-zero rank's loop: pass each command on, run it on this slice, until STOP (or
    until a neighbour is lost: MLX's ring raises, and the caller's process exits)."""
    last = ring.rank == ring.size - 1
    while True:
        cmd = Command.decode(ring.recv((HEADER_WORDS,), mx.int32))
        if not last:
            ring.send(cmd.encode())
        if cmd.op == STOP:
            log.info("pipeline.stop", rank=ring.rank)
            return
        if cmd.op == NEW_CACHE:
            stage.new(cmd.cache_id)
        elif cmd.op == FREE_CACHE:
            stage.free(cmd.cache_id)
        elif cmd.op == ROLLBACK:
            stage.rollback(cmd)
        elif cmd.op == SNAPSHOT:
            state = stage.snapshot(cmd.cache_id, cmd.keep)
            held = ring.recv((1,), mx.int64)  # the earlier ranks' bytes; this rank's added
            ring.send(held + sum(a.nbytes for layer in state for a in layer.arrays))
        elif cmd.op == RESTORE:
            stage.restore(cmd.cache_id, cmd.keep)
        elif cmd.op == DROP_SNAPSHOT:
            stage.snapshots.pop(cmd.keep, None)
        elif cmd.op == FORWARD:
            carried = carried_layers(cmd.capture, slices, ring.rank)
            dtype = DTYPES[cmd.dtype]
            payload = ring.recv((1, cmd.tokens, hidden * (1 + len(carried))), dtype)
            h, captured = stage.run(cmd, payload[..., :hidden])
            parts: list[mx.array] = [h, payload[..., hidden:]] if carried else [h]
            out = mx.concatenate([*parts, *captured], axis=-1).astype(dtype)
            if last and result_rows(cmd, slices) == 1:
                out = out[:, -1:]
            ring.send(out)
        else:
            raise PipelineError(f"unknown pipeline command {cmd.op}")
