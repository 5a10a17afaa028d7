"""`toolflash bench` at several temperatures, on the scripted fake engine (no model)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.fake_engine import FakeEngine
from toolflash import bench
from toolflash.bench import BenchPrompt, format_report, run_benchmark


@pytest.fixture(autouse=True)
def no_mlx_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "machine_info", lambda: {"device": "fake", "blas": "none"})


def test_every_kind_at_every_temperature_side_by_side() -> None:
    engine = FakeEngine()
    seen: list[Any] = []
    generate = engine.generate

    def record(request: Any, *a: Any, **kw: Any) -> Any:
        seen.append(request.sampling)
        return generate(request, *a, **kw)

    engine.generate = record  # type: ignore[method-assign]
    prompts = [
        BenchPrompt("code", [{"role": "user", "content": "SCRIPT:def f(): pass"}]),
        BenchPrompt("json", [{"role": "user", "content": 'SCRIPT:{"a": 1}'}]),
    ]
    report = run_benchmark(engine, prompts, max_tokens=16, temperatures=(0.0, 0.6), seed=5)
    rows = [(r["kind"], r["temperature"], r["lossless"]) for r in report["kinds"]]
    assert rows == [
        ("code", 0.0, True),
        ("code", 0.6, None),
        ("json", 0.0, True),
        ("json", 0.6, None),
    ]
    assert report["temperatures"] == [0.0, 0.6] and report["seed"] == 5
    sampled = [s for s in seen if s.temperature == 0.6]
    assert sampled and {s.seed for s in sampled} == {5}  # one prompt per kind, one repeat
    text = format_report(report)
    assert "T=0.6" in text and "tokens per cycle / speedup vs AR" in text


def test_pooled_ratio_weighs_long_runs() -> None:
    # AR: 10 tokens in 1 s and 100 in 10 s; spec: 4x faster on the short run, even on the
    # long one. The per-run median says 2.5x; all tokens over all time say ~1.07x.
    spec = [110.0, 0.25 + 10.0]
    ar = [110.0, 1.0 + 10.0]
    assert bench._pooled_ratio(spec, ar) == pytest.approx(11.0 / 10.25)
    assert bench._pooled_ratio([0.0, 0.0], ar) == 0.0
    assert bench._pooled_ratio(spec, [0.0, 0.0]) == 0.0


def test_draft_lengths_side_by_side_share_the_ar_runs() -> None:
    engine = FakeEngine()
    seen: list[Any] = []
    generate = engine.generate

    def record(request: Any, *a: Any, **kw: Any) -> Any:
        seen.append((request.mode, request.draft_length, request.max_tokens))
        return generate(request, *a, **kw)

    engine.generate = record  # type: ignore[method-assign]
    prompts = [BenchPrompt("code", [{"role": "user", "content": "SCRIPT:def f(): pass"}])]
    report = run_benchmark(engine, prompts, max_tokens=16, draft_lengths=("fixed", "adaptive"))
    rows = [(r["kind"], r["draft_length"], r["lossless"]) for r in report["kinds"]]
    assert rows == [("code", "fixed", True), ("code", "adaptive", True)]
    assert report["kinds"][0]["ar_tok_s"] == report["kinds"][1]["ar_tok_s"]
    measured = [s for s in seen if s[2] == 16]  # the warm-up asks for 8 tokens
    assert measured == [("ar", None, 16), ("spec", "fixed", 16), ("spec", "adaptive", 16)]
    assert "adaptive" in format_report(report) and "fixed" in format_report(report)


def test_progress_bar_counts_every_measured_run_and_the_report_says_what_it_measures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    prompts = [
        BenchPrompt(kind, [{"role": "user", "content": "SCRIPT:hello there"}])
        for kind in ("code", "code", "json")
    ]
    report = run_benchmark(
        FakeEngine(), prompts, max_tokens=8, repeats=2, draft_lengths=("fixed", "adaptive"),
        progress=True,
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "bench" in err and "18/18" in err  # 3 prompts x 2 repeats x (AR + 2 spec)
    first = format_report(report).splitlines()[0]
    assert first.startswith("speculative vs toolflash's own AR decoding, 2 prompts per kind")
    assert "8 new tokens, 2 repetition(s)" in first and "--baseline mlx-lm" in first
    run_benchmark(FakeEngine(), prompts, max_tokens=8)
    assert capsys.readouterr().err == ""  # no bar unless asked


def test_no_flags_run_the_readme_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """`toolflash bench` alone: every held-out prompt per kind (30), 128 new tokens, one
    repetition, adaptive draft length: the run behind the README's figures."""
    import toolflash.engine.factory as factory
    from toolflash.cli import build_parser
    from toolflash.commands import bench as bench_command

    seen: dict[str, Any] = {}

    def fake_run(engine: Any, prompts: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        seen.update(prompts=prompts, args=args, kw=kw)
        return {"model": "m", "draft": "d", "max_tokens": args[0], "repeats": args[1],
                "machine": {"device": "fake", "blas": "none"}, "kinds": []}  # fmt: skip

    monkeypatch.setattr(factory, "build_engine", lambda *a, **kw: FakeEngine())
    monkeypatch.setattr(bench, "run_benchmark", fake_run)
    assert bench_command.run(build_parser().parse_args(["bench"])) == 0
    kinds = [p.kind for p in seen["prompts"]]
    assert {kinds.count(k) for k in set(kinds)} == {30} and len(set(kinds)) == 4
    assert seen["args"][:2] == (128, 1) and list(seen["args"][4]) == ["adaptive"]
    assert seen["kw"]["progress"] is True
