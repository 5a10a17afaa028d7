"""`toolflash serve --distributed hosts.json`: the target's layers split across the hosts of an
mlx.launch hostfile (engine/distributed.py, engine/targets/pipeline.py; SERVER.md, Distributed
target).

Without MLX_RANK, the command starts the ranks itself: it runs mlx.launch with the hostfile and
the backend (`distributed_backend`: ring, or jaccl for RDMA over Thunderbolt 5) on the same
`toolflash serve` command line. With MLX_RANK (set by mlx.launch, or by hand on each host, e.g.
from a service unit), this process is that rank: rank 0 serves HTTP with the pipeline target,
one request at a time, and every other rank serves its layers to rank 0 until rank 0 stops.
Started by hand, the backend's settings come from the hostfile as mlx.launch derives them: the
ring's addresses (each host's "ips", ports from 32323 up), or jaccl's coordinator (the first
host's first "ips" address) and RDMA device file (each host's "rdma").
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolflash.commands.settings_cli import SettingsError

# The MLX backends a pipeline runs over (its stages only send to and receive from neighbours).
BACKENDS = ("ring", "jaccl")


def _read(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SettingsError(f"--distributed {path}: not a readable JSON hostfile ({exc})") from None


def backend_for(path: str, chosen: str | None) -> str:
    """The backend the ranks join, as mlx.launch picks it: `chosen` (--distributed-backend), else
    the hostfile's "backend", else ring; a clear error for one the pipeline does not run over,
    or one this machine's MLX lacks."""
    data = _read(path)
    named = data.get("backend") if isinstance(data, dict) else None
    backend = chosen or named or "ring"
    if backend not in BACKENDS:
        raise SettingsError(
            f"--distributed {path}: the hostfile names backend {backend!r}; a pipeline runs over "
            f"{' or '.join(BACKENDS)} (--distributed-backend chooses)"
        )
    import mlx.core as mx

    if not mx.distributed.is_available(backend):
        raise SettingsError(
            f"--distributed-backend {backend}: this machine's MLX {getattr(mx, '__version__', '')} cannot run it"
            + (
                " (jaccl needs Macs with Thunderbolt 5 on macOS 26.2 or later, RDMA enabled with"
                " `rdma_ctl enable` in macOS Recovery: SERVER.md, Distributed target)"
                if backend == "jaccl"
                else ""
            )
        )
    return backend


def check_hostfile(path: str, backend: str = "ring") -> int:
    """The number of hosts in an mlx.launch hostfile (a list of hosts, or {"hosts": [...]},
    each with "ssh" and, for the ring backend, "ips"; for jaccl, "rdma": one entry per host,
    null at its own place, and "ips" on the first host, the coordinator); a clear error when
    it is not one."""
    data = _read(path)
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or len(hosts) < 2:
        raise SettingsError(f"--distributed {path}: the hostfile must list at least 2 hosts")
    for i, host in enumerate(hosts):
        if not isinstance(host, dict) or not host.get("ssh"):
            raise SettingsError(f'--distributed {path}: host {i} needs "ssh" (a host name)')
        if backend == "ring" and not host.get("ips"):
            raise SettingsError(
                f'--distributed {path}: host {i} needs "ips" (the addresses the ring connects to)'
            )
        if backend == "jaccl":
            rdma = host.get("rdma")
            if not isinstance(rdma, list) or len(rdma) != len(hosts) or rdma[i] is not None:
                raise SettingsError(
                    f'--distributed {path}: for jaccl, host {i} needs "rdma": its RDMA device '
                    f"to each of the {len(hosts)} hosts (null for itself), as "
                    "`mlx.distributed_config --backend jaccl` writes it"
                )
    if backend == "jaccl" and not hosts[0].get("ips"):
        raise SettingsError(
            f'--distributed {path}: for jaccl, the first host needs "ips" (the coordinator '
            "address every rank reaches)"
        )
    return len(hosts)


def free_port_run(count: int) -> int:
    """A port p with p .. p + count - 1 free on every interface (mlx.launch's ring listens on
    consecutive ports from --starting-port)."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind(("", 0))
            base = int(s.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            for port in range(base + 1, base + count):
                with socket.socket() as s:
                    s.bind(("", port))
        except OSError:
            continue
        return base
    raise SettingsError("no run of free ports for the ring")


def launch_command(
    hostfile: str, hosts: int, argv: Sequence[str], backend: str = "ring"
) -> list[str]:
    """mlx.launch over `hostfile` with `backend` running `toolflash serve` with `argv` (the
    serve command line) on every host."""
    launcher = shutil.which("mlx.launch")
    head = (
        [launcher]
        if launcher
        else [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()"]
    )
    serve = [sys.executable, "-m", "toolflash.cli", *argv]
    return [
        *head,
        "--hostfile",
        hostfile,
        "--backend",
        backend,
        "--starting-port",
        str(free_port_run(hosts)),
        "--",
        *serve,
    ]


def launch(hostfile: str, argv: Sequence[str], backend: str) -> int:
    """Start the ranks with mlx.launch and wait for them (its exit status)."""
    import subprocess

    command = launch_command(hostfile, check_hostfile(hostfile, backend), argv, backend)
    print(f"toolflash serve: starting the ranks: {' '.join(command)}", file=sys.stderr)
    return subprocess.call(command)


# mlx.launch's default --starting-port: ranks started by hand listen where it would.
RING_PORT = 32323


def is_rank() -> bool:
    """Whether this process is a rank (MLX_RANK set: by mlx.launch, or by hand)."""
    return "MLX_RANK" in os.environ


def ring_addresses(path: str, starting_port: int = RING_PORT) -> list[list[str]]:
    """The ring backend's MLX_HOSTFILE content for an mlx.launch hostfile, as mlx.launch
    writes it: per host, "ip:port" for each of its "ips", ports counting up across hosts."""
    check_hostfile(path)
    data = json.loads(Path(path).read_text())
    hosts: list[dict] = data["hosts"] if isinstance(data, dict) else data
    port = starting_port
    ring = []
    for host in hosts:
        ring.append([f"{ip}:{port + k}" for k, ip in enumerate(host["ips"])])
        port += len(host["ips"])
    return ring


def _env_file(name: str, content: Any) -> None:
    """Point environment variable `name` at a new JSON file of `content` (as mlx.launch does)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(content, f)
    os.environ[name] = f.name


def rank_env(path: str, backend: str) -> None:
    """For a rank started by hand (MLX_RANK set, the backend's variables not): what mlx.launch
    would set from the hostfile `path`. Ring: MLX_HOSTFILE, the ring's addresses. Jaccl:
    MLX_JACCL_COORDINATOR (the first host's first address, port 32323) and MLX_IBV_DEVICES
    (each host's RDMA devices)."""
    check_hostfile(path, backend)
    if backend == "ring":
        if "MLX_HOSTFILE" not in os.environ:
            _env_file("MLX_HOSTFILE", ring_addresses(path))
        return
    data = json.loads(Path(path).read_text())
    hosts: list[dict] = data["hosts"] if isinstance(data, dict) else data
    os.environ.setdefault("MLX_JACCL_COORDINATOR", f"{hosts[0]['ips'][0]}:{RING_PORT}")
    if "MLX_IBV_DEVICES" not in os.environ:
        _env_file("MLX_IBV_DEVICES", [h["rdma"] for h in hosts])
