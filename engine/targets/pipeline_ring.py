"""The pipeline's transport: MLX's ring backend (mx.distributed), neighbours only.

MLX's ring receive busy-polls its sockets until the bytes arrive (a waiting rank burns a core:
measured here, 2.1 s of CPU over a 3 s wait), and it has no timeout. So before each receive a
rank first waits for one of the ring's sockets to be readable with `select`, which costs no CPU
and takes a timeout: an idle rank sleeps, and rank 0 gives up on a rank that stopped answering
instead of hanging. The ring's sockets are the ones `join` sees appear during
`mx.distributed.init`, less listening ones and ones its setup already closed (a peer that
closes its end makes a socket readable too, and MLX's receive then raises "connection to a
peer was lost").
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import stat
import struct
import termios
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx


def socket_fds() -> frozenset[int]:
    """This process's open socket descriptors."""
    names = os.listdir("/dev/fd") if os.path.isdir("/dev/fd") else []
    fds = set()
    for name in names:
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                fds.add(int(name))
        except (OSError, ValueError):
            continue
    return frozenset(fds)


@dataclass(frozen=True)
class RingGroup:
    """An mx.distributed ring group, the sockets it opened, and how long rank 0 waits for an
    answer (seconds) before it declares the pipeline lost."""

    group: Any
    fds: frozenset[int]
    timeout_s: float

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def size(self) -> int:
        return int(self.group.size())


def pending_bytes(fd: int) -> int:
    """Bytes waiting to be read on socket `fd`."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])


def data_sockets(fds: frozenset[int]) -> frozenset[int]:
    """Of the sockets the ring's setup left open, those that carry its data: not listening
    ones, nor ones already at end of file (a setup connection the peer closed), which would
    always be readable and make every wait return at once."""
    kept = set()
    for fd in fds:
        probe = socket.socket(fileno=fd)
        try:
            if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue
        finally:
            probe.detach()  # the descriptor stays MLX's
        readable, _, _ = select.select([fd], [], [], 0)
        if readable and pending_bytes(fd) == 0:
            continue
        kept.add(fd)
    return frozenset(kept)


def join(timeout_s: float, backend: str = "ring") -> RingGroup:
    """Join the ranks started by mlx.launch (MLX_RANK and the backend's variables) over
    `backend`. Only the ring's transfers go through sockets a rank can wait on: over jaccl
    (RDMA) a receive is MLX's own, without the timeout."""
    before = socket_fds()
    group = mx.distributed.init(strict=True, backend=backend)
    fds = data_sockets(socket_fds() - before) if backend == "ring" else frozenset()
    return RingGroup(group, fds, timeout_s)


def ring_layout() -> str | None:
    """The pipeline this process is a rank of, for what timings depend on (a calibration
    key): the ranks' addresses in ring order (ports left out: they change per launch); None
    outside a launched ring."""
    path = os.environ.get("MLX_HOSTFILE")
    if "MLX_RANK" not in os.environ or not path:
        return None
    try:
        with open(path) as f:
            ranks = json.load(f)
        hosts = [",".join(addr.rsplit(":", 1)[0] for addr in rank) for rank in ranks]
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return f"{len(hosts)} ranks: " + " | ".join(hosts)


class RingTimeout(Exception):
    """No neighbour sent anything within the timeout."""


class Ring:
    """Send and receive with the neighbours, every transfer evaluated at once."""

    def __init__(self, ring: RingGroup):
        self.group = ring.group
        self.fds = sorted(ring.fds)
        self.rank, self.size = ring.rank, ring.size
        self.next, self.prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size

    def send(self, x: mx.array) -> None:
        mx.eval(mx.distributed.send(x, self.next, group=self.group))

    def recv(
        self, shape: Sequence[int], dtype: mx.Dtype, timeout_s: float | None = None
    ) -> mx.array:
        """Wait (asleep, at most `timeout_s`; None: no limit) for the previous rank's bytes,
        then receive them."""
        if self.fds:
            readable, _, _ = select.select(self.fds, [], [], timeout_s)
            if not readable:
                raise RingTimeout(f"no answer from rank {self.prev} within {timeout_s:g} s")
        out = mx.distributed.recv(tuple(shape), dtype, self.prev, group=self.group)
        mx.eval(out)
        return out
