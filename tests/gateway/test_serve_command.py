"""`toolflash serve` argument handling (the server itself is covered by the uvicorn tests)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from toolflash.commands import serve


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return p.parse_args(list(argv))


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLFLASH_API_KEY", raising=False)
    args = parse()
    assert (args.host, args.port, args.mode, args.max_queue) == ("127.0.0.1", 8000, "spec", 16)
    assert args.model is None and args.draft is None and args.block_size is None
    args = parse(
        "--model", "m", "--draft", "d", "--mode", "ar", "--block-size", "8", "--max-queue", "2"
    )
    assert (args.model, args.draft, args.mode, args.block_size, args.max_queue) == (
        "m",
        "d",
        "ar",
        8,
        2,
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("::", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert serve.is_loopback(host) is loopback


def test_non_loopback_requires_api_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TOOLFLASH_API_KEY", raising=False)
    assert serve.run(parse("--host", "0.0.0.0")) == 2
    assert "--api-key" in capsys.readouterr().err


def test_engine_factory_is_lazy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple] = []

    import toolflash.engine.factory as factory

    monkeypatch.setattr(factory, "build_engine", lambda *a, **kw: calls.append((a, kw)) or "engine")
    build = serve._engine_factory(parse("--model", "m", "--block-size", "4", "--mode", "ar"))
    assert calls == []  # nothing is loaded until the lifespan's worker calls it
    assert build() == "engine"
    ((args, kwargs),) = calls
    assert args == ("m", None) and kwargs["mode"] == "ar" and kwargs["block_size"] == 4
    assert kwargs["cache"].enabled and kwargs["cache"].l2_dir is None


def test_served_by_the_command_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """build_server -> uvicorn binding its own socket: lifespan, engine factory, real requests."""
    import socket
    import threading
    import time

    import httpx

    import toolflash.engine.factory as factory
    from tests.gateway.fake_engine import FakeEngine

    monkeypatch.setattr(factory, "build_engine", lambda *a, **kw: FakeEngine(model_id="cmd-model"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server, failed = serve.build_server(
        # Its own state directory: a test must not teach the user's policy state.
        parse(
            "--port", str(port), "--api-key", "k", "--max-queue", "3", "--state-dir", str(tmp_path)
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        # asyncio sets TCP_NODELAY only on sockets whose proto is TCP (else ~40 ms per reply);
        # uvloop (a dependency, uvicorn's "auto" loop) sets it on every TCP connection.
        listening = server.servers[0]
        if type(listening.get_loop()).__module__.startswith("asyncio"):
            assert all(sock.proto == socket.IPPROTO_TCP for sock in listening.sockets)
        else:
            assert type(listening.get_loop()).__module__ == "uvloop"
        headers = {"Authorization": "Bearer k"}
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "cmd-model", "messages": [{"role": "user", "content": "SCRIPT:ok"}]},
            headers=headers,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
        assert httpx.get(f"{url}/v1/status", headers=headers).json()["queue"]["limit"] == 3
        assert failed == []
    finally:
        server.should_exit = True
        thread.join(10)


def test_load_failure_stops_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    import toolflash.engine.factory as factory

    def broken(*a: object, **kw: object) -> None:
        raise RuntimeError("no weights")

    monkeypatch.setattr(factory, "build_engine", broken)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server, failed = serve.build_server(parse("--port", str(port)))
    server.run()  # returns by itself once the load fails
    assert [str(e) for e in failed] == ["no weights"]


def test_yaml_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLFLASH_API_KEY", raising=False)
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "model: org/target\nmax-queue: 4\nmode: ar\nserved_model_name: [a, b]\nport: 9000\n"
    )
    args = serve.apply_config(parse("--port", "8123", "--config", str(cfg)), str(cfg))
    assert (args.model, args.max_queue, args.mode, args.port) == ("org/target", 4, "ar", 8123)
    assert serve.config_from_args(args).served_model_names == ("a", "b")
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: turbo\n")
    with pytest.raises(ValueError, match="turbo"):
        serve.apply_config(parse(), str(bad))
    bad.write_text("nonsense: 1\n")
    with pytest.raises(ValueError, match="unknown option"):
        serve.apply_config(parse(), str(bad))
    assert serve.run(parse("--config", str(bad))) == 2


def test_input_limits_are_flags_derived_from_the_config(tmp_path: Path) -> None:
    """Each `GatewayConfig` setting with a `help` is a flag with its declared default; list
    settings are comma-separated and repeatable, in YAML too."""
    from toolflash.gateway.config import GatewayConfig

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    assert serve.config_from_args(p.parse_args([])) == GatewayConfig()
    args = p.parse_args(
        [
            "--max-json-depth",
            "8",
            "--template-kwargs",
            "enable_thinking,x",
            "--template-kwargs",
            "y",
        ]
    )
    config = serve.config_from_args(args)
    assert config.max_json_depth == 8 and config.template_kwargs == ("enable_thinking", "x", "y")
    path = tmp_path / "serve.yaml"
    path.write_text("template_kwargs: [a, b]\nrender_timeout_s: 2.5\nmax_body_mb: 1\n")
    config = serve.config_from_args(serve.apply_config(p.parse_args([]), str(path)))
    assert config.template_kwargs == ("a", "b") and config.render_timeout_s == 2.5
    assert config.max_body_bytes == 1 << 20
