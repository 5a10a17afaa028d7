"""`toolflash serve --distributed hosts.json`: the target's layers split across the hosts of an
mlx.launch hostfile (engine/distributed.py, engine/targets/pipeline.py; SERVER.md, Distributed
target).

Without MLX_RANK, the command starts the ranks itself: it runs mlx.launch with the hostfile and
the ring backend on the same `toolflash serve` command line. With MLX_RANK (set by mlx.launch,
or by hand on each host, e.g. from a service unit), this process is that rank: rank 0 serves
HTTP with the pipeline target, one request at a time, and every other rank serves its layers
to rank 0 until rank 0 stops. Started by hand, the ring's addresses come from the hostfile as
mlx.launch derives them (each host's "ips", ports from 32323 up).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from toolflash.commands.settings_cli import SettingsError


def check_hostfile(path: str) -> int:
    """The number of hosts in an mlx.launch hostfile (a list of hosts, or {"hosts": [...]},
    each with "ssh" and, for the ring backend, "ips"); a clear error when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SettingsError(f"--distributed {path}: not a readable JSON hostfile ({exc})") from None
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or len(hosts) < 2:
        raise SettingsError(f"--distributed {path}: the hostfile must list at least 2 hosts")
    for i, host in enumerate(hosts):
        if not isinstance(host, dict) or not host.get("ssh") or not host.get("ips"):
            raise SettingsError(
                f'--distributed {path}: host {i} needs "ssh" (a host name) and "ips" (the '
                "addresses the ring connects to)"
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


def launch_command(hostfile: str, hosts: int, argv: Sequence[str]) -> list[str]:
    """mlx.launch over `hostfile` (ring backend) running `toolflash serve` with `argv` (the
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
        "ring",
        "--starting-port",
        str(free_port_run(hosts)),
        "--",
        *serve,
    ]


def launch(hostfile: str, argv: Sequence[str]) -> int:
    """Start the ranks with mlx.launch and wait for them (its exit status)."""
    import subprocess

    command = launch_command(hostfile, check_hostfile(hostfile), argv)
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


def ring_env(path: str) -> None:
    """For a rank started by hand (MLX_RANK set, no MLX_HOSTFILE): point MLX_HOSTFILE at the
    ring addresses of the hostfile `path`."""
    if "MLX_HOSTFILE" in os.environ:
        return
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ring_addresses(path), f)
    os.environ["MLX_HOSTFILE"] = f.name
