"""Lowering the event loop thread's CPU priority below the engine's (`loop_nice`).

On a machine whose cores a CPU engine fills (MLX's calling thread and its stream thread hand
work back and forth ~23 times a token), every wake-up of the loop takes a core from one of them:
on 2 cores, a greedy AR stream of the embedded qwen35 pair decoded ~8% slower than the same
request answered in one body, the engine thread waiting for a core ~90 us a token. With the
loop at a lower priority its per-token work waits for a core the engine leaves free: ~4% of
that decode back, each token handed over ~0.5 ms later (`benchmarks/results/README.md`).
"""

from __future__ import annotations

import os
import sys
import threading

# The loop's nice steps where `loop_nice` is unset and the engine fills the cores: the
# setting measured (`benchmarks/loop_nice_paired.py --nice 10`).
AUTO_LOOP_NICE = 10


def loop_nice_for(setting: int | None, engine_on_cpu: bool, cores: int) -> int:
    """The loop thread's nice steps: the setting where one is given; unset, `AUTO_LOOP_NICE`
    where a CPU engine's two busy threads (MLX's calling thread and its stream thread) leave
    the loop no core of its own, else 0 (a GPU engine or a free core has no such contention)."""
    if setting is not None:
        return setting
    return AUTO_LOOP_NICE if engine_on_cpu and cores <= 2 else 0


def usable_cores() -> int:
    """Cores this process may run on (its affinity where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def mlx_on_cpu() -> bool:
    """Whether MLX's default device, the local engine's, is the CPU."""
    import mlx.core as mx  # the local engine's library; only asked where one runs

    return bool(mx.default_device() == mx.cpu)


def lower_this_thread(steps: int) -> bool:
    """Raise the calling thread's nice value by `steps` (at most 19). Only on Linux, where
    nice is per thread (elsewhere `setpriority` would lower the whole process, the engine's
    threads with it); False where nothing changed."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    now = os.getpriority(os.PRIO_PROCESS, tid)
    os.setpriority(os.PRIO_PROCESS, tid, min(19, now + steps))
    return True
