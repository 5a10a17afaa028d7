"""`toolflash serve` argument handling (the server itself is covered by the uvicorn tests)."""

from __future__ import annotations

import argparse

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
    assert calls == [(("m", None), {"mode": "ar", "block_size": 4})]
