"""`toolflash serve --distributed`: the hostfile checks, the ring addresses of ranks started by
hand, and a 2-rank server over loopback answering as a single-process server does, then a
clear error in the API's shape once a rank is gone (processes started here, stopped by PID)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from toolflash.commands import serve as serve_command
from toolflash.commands.serve_distributed import (
    backend_for,
    check_hostfile,
    launch_command,
    rank_env,
    ring_addresses,
)
from toolflash.commands.settings_cli import SettingsError
from toolflash.ports import free_port

MODEL = "toolflash-tiny-qwen35"


def test_hostfile_checks_and_ring_addresses(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hosts = [{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2", "10.0.1.2"]}]
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": hosts}))
    assert check_hostfile(str(hostfile)) == 2
    # As mlx.launch numbers them: one port per address, counting up across hosts.
    assert ring_addresses(str(hostfile), 40000) == [
        ["10.0.0.1:40000"],
        ["10.0.0.2:40001", "10.0.1.2:40002"],
    ]
    command = launch_command(str(hostfile), 2, ["serve", "--distributed", str(hostfile)])
    assert command[command.index("--hostfile") + 1] == str(hostfile)
    assert command[command.index("--backend") + 1] == "ring"
    assert command[-4:] == ["toolflash.cli", "serve", "--distributed", str(hostfile)]
    for bad in ([{"ssh": "mac1", "ips": ["10.0.0.1"]}], [{"ssh": "a"}, {"ssh": "b"}], "{"):
        hostfile.write_text(bad if isinstance(bad, str) else json.dumps(bad))
        with pytest.raises(SettingsError):
            check_hostfile(str(hostfile))


JACCL_HOSTS = [
    {"ssh": "mac1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en2"]},
    {"ssh": "mac2", "ips": [], "rdma": ["rdma_en2", None]},
]


def test_jaccl_hostfile_launch_and_rank_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "jaccl", "hosts": JACCL_HOSTS}))
    assert check_hostfile(str(hostfile), "jaccl") == 2
    with pytest.raises(SettingsError, match='needs "ips"'):
        check_hostfile(str(hostfile), "ring")  # the second host has no ring address
    command = launch_command(str(hostfile), 2, ["serve"], "jaccl")
    assert command[command.index("--backend") + 1] == "jaccl"
    for env in ("MLX_JACCL_COORDINATOR", "MLX_IBV_DEVICES", "MLX_HOSTFILE"):
        monkeypatch.delenv(env, raising=False)
    rank_env(str(hostfile), "jaccl")  # a rank started by hand: what mlx.launch would set
    assert os.environ["MLX_JACCL_COORDINATOR"] == "10.0.0.1:32323"
    assert json.loads(Path(os.environ["MLX_IBV_DEVICES"]).read_text()) == [
        [None, "rdma_en2"],
        ["rdma_en2", None],
    ]
    assert "MLX_HOSTFILE" not in os.environ
    bad = [dict(JACCL_HOSTS[0], rdma=["rdma_en2", None]), JACCL_HOSTS[1]]  # not null at self
    hostfile.write_text(json.dumps(bad))
    with pytest.raises(SettingsError, match='"rdma"'):
        check_hostfile(str(hostfile), "jaccl")


def test_backend_choice_and_its_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx.core as mx

    hostfile = tmp_path / "hosts.json"
    hosts = [{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]
    hostfile.write_text(json.dumps(hosts))
    monkeypatch.setattr(mx.distributed, "is_available", lambda backend="any": True)
    assert backend_for(str(hostfile), None) == "ring"  # no backend named: ring
    assert backend_for(str(hostfile), "jaccl") == "jaccl"  # the flag
    hostfile.write_text(json.dumps({"backend": "jaccl", "hosts": hosts}))
    assert backend_for(str(hostfile), None) == "jaccl"  # the hostfile's
    assert backend_for(str(hostfile), "ring") == "ring"  # the flag wins, as in mlx.launch
    hostfile.write_text(json.dumps({"backend": "mpi", "hosts": hosts}))
    with pytest.raises(SettingsError, match="backend 'mpi'.*ring or jaccl"):
        backend_for(str(hostfile), None)
    hostfile.write_text(json.dumps(hosts))
    monkeypatch.setattr(mx.distributed, "is_available", lambda backend="any": backend == "ring")
    with pytest.raises(SettingsError, match="cannot run it.*rdma_ctl enable"):
        backend_for(str(hostfile), "jaccl")


def test_serve_rejects_a_backend_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    import mlx.core as mx

    def run(*argv: str) -> int:
        p = argparse.ArgumentParser()
        serve_command.add_arguments(p)
        return serve_command.run(p.parse_args(list(argv)))

    monkeypatch.setattr(mx.distributed, "is_available", lambda backend="any": backend == "ring")
    monkeypatch.delenv("MLX_RANK", raising=False)
    assert run("--distributed-backend", "jaccl") == 2
    assert "--distributed-backend needs --distributed" in capsys.readouterr().err
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "jaccl", "hosts": JACCL_HOSTS}))
    assert run("--distributed", str(hostfile)) == 2  # before any rank is started
    assert "--distributed-backend jaccl: this machine's MLX" in capsys.readouterr().err


def serve(port: int, extra: list[str], env: dict[str, str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "toolflash.cli", "serve", "--port", str(port)]
    command += ["--model", MODEL, "--policy", "off", "--no-calibrate", *extra]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )


def wait_ready(port: int, processes: list[subprocess.Popen], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in processes), "a server exited while starting"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if json.loads(r.read()).get("status") == "ready":
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"port {port} not ready in {timeout} s")


def chat(port: int, content: str, stream: bool = False) -> tuple[int, Any]:
    """Status and JSON body (streamed: the list of the events' JSON payloads)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": stream,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            if not stream:
                return r.status, json.loads(r.read())
            lines = r.read().decode().splitlines()
            data = [x.removeprefix("data: ") for x in lines if x.startswith("data: ")]
            return r.status, [json.loads(x) for x in data if x != "[DONE]"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def health(port: int) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_distributed_server_matches_single_process(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hosts = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2
    hostfile.write_text(json.dumps({"hosts": hosts}))
    ring = tmp_path / "ring.json"  # free ports (ranks started by hand take 32323 and up)
    ring.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(2)]))
    env = {**os.environ, "MLX_HOSTFILE": str(ring)}
    dist_port, single_port = free_port(), free_port()
    ranks = [
        serve(dist_port, ["--distributed", str(hostfile)], {**env, "MLX_RANK": str(rank)})
        for rank in range(2)
    ]
    single = serve(single_port, [], dict(os.environ))
    try:
        wait_ready(dist_port, ranks)
        wait_ready(single_port, [single])
        for prompt in ("def add(a, b):", "The list of tools is"):
            status, got = chat(dist_port, prompt)
            _, want = chat(single_port, prompt)
            assert status == 200
            assert got["choices"][0]["message"] == want["choices"][0]["message"]
            assert got["usage"]["completion_tokens"] == 24
        assert health(dist_port) == (200, {"status": "ready"})
        ranks[1].kill()
        ranks[1].wait(timeout=10)
        status, failed = chat(dist_port, "def add(a, b):")
        assert status == 500
        assert "pipeline rank lost" in failed["error"]["message"]
        status, events = chat(dist_port, "def add(a, b):", stream=True)  # at once, no hang
        assert "pipeline rank lost" in events[-1]["error"]["message"]
        # /health says so, as it says a failed load: a balancer stops sending requests here.
        status, body = health(dist_port)
        assert status == 503
        assert body["status"] == "failed"
        assert "pipeline rank lost" in body["error"]
        assert health(single_port) == (200, {"status": "ready"})
        ranks[0].send_signal(signal.SIGTERM)
        assert ranks[0].wait(timeout=30) is not None
    finally:
        for p in [*ranks, single]:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
