"""`toolflash calibrate` on a tiny random pair: the estimates it seeds are the ones the policy
reads, the first decision follows them, a valid record is reused, and `serve --no-calibrate`
skips it."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("mlx.core")

from toolflash.policy.adaptive import AdaptivePolicy  # noqa: E402
from toolflash.policy.config import PolicyConfig  # noqa: E402

PLAN_KW = {
    "prompts_per_kind": 1,
    "max_tokens": 12,
    "thinking_default": False,
    "contexts": (),
    "timing_cycles": 2,
    "timing_steps": 4,
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.engine.model_dirs import write_draft, write_qwen3_target
    from toolflash.engine.factory import build_engine

    root: Path = tmp_path_factory.mktemp("calibrate-models")
    config = write_qwen3_target(root / "target")
    write_draft(root / "draft", config)
    return build_engine(str(root / "target"), str(root / "draft"))


def _policy(tmp_path: Path) -> AdaptivePolicy:
    # The opening probe would turn a start in AR into one spec cycle: off, so the start
    # decision is the class estimates' alone.
    tmp_path.mkdir(parents=True, exist_ok=True)
    f = tmp_path / "policy.yaml"
    f.write_text(f"state_dir: {tmp_path / 'state'}\nexploration:\n  opening_probe: false\n")
    return AdaptivePolicy(PolicyConfig([f]))


def test_calibration_seeds_what_the_policy_reads(engine: Any, tmp_path: Path) -> None:
    from toolflash.calibrate import CalibrationPlan, _prepare, ensure_calibrated
    from toolflash.calibration_requests import class_bodies

    plan = CalibrationPlan(**PLAN_KW)  # type: ignore[arg-type]
    cold = _policy(tmp_path / "cold")
    policy = _policy(tmp_path)
    record, measured = ensure_calibrated(engine, policy, plan, progress=False)
    assert measured and record.key.model == engine.model_id
    timing = [r for r in record.rows if r["row"] == "timing"]
    assert timing and all(r["ar_ms"] > 0 for r in timing)
    assert set(timing[0]["cycle_ms"]) >= {str(engine.default_block_size)}

    model = engine.model_id
    est = policy.model(model).estimates
    kinds: dict[str, Any] = {}
    for kind, body in class_bodies(plan.prompts_per_kind, plan.thinking_default):
        kinds.setdefault(kind, _prepare(engine, body))
    assert set(kinds) == {"chat", "tools", "tool-result", "tool-forced", "json"}
    block = engine.default_block_size
    for kind in ("chat", "json"):
        p = kinds[kind]
        rc = p.request_class
        span = "json" if kind == "json" else "text"
        ctx = len(p.request.prompt_tokens)
        surplus = est.surplus(model, rc.label, span, block, ctx)
        # AR and cycle timings are own samples; the class's tau a prior (0 own samples).
        assert surplus.spec.known and surplus.ar.known and surplus.ar.samples > 0
        assert (model, rc.label, span, block) in est.prior_tau
        assert any(r.get("class") == rc.label and r["span"] == span for r in record.rows)

        rule = policy.model(model).policy.rule(rc.label, span)
        blocks = [b for b in rule.block_sizes if b <= block] or [block]
        best_spec = max(est.spec(model, rc.label, span, b, ctx)[0].tps for b in blocks)
        ar = est.ar(model, ctx, rc.label, span).tps
        decision = _first_decision(policy, model, rc, ctx, block)
        assert decision.mode == ("spec" if best_spec > ar else "ar"), decision.reason
        assert "fastest known" in decision.reason
        # Without calibration the same request starts from nothing measured.
        assert "not measured" in _first_decision(cold, model, rc, ctx, block).reason

    # Saved through the policy's store: a restarted server reads the same estimates, and
    # the valid record is reused rather than measured again.
    again = _policy(tmp_path)
    rc = kinds["json"].request_class
    ctx = len(kinds["json"].request.prompt_tokens)
    restarted = again.model(model).estimates.surplus(model, rc.label, "json", block, ctx)
    assert restarted.spec.known and restarted.ar.samples > 0
    record2, measured2 = ensure_calibrated(engine, again, plan, progress=False)
    assert not measured2 and record2 == record


def test_a_target_without_a_drafter_calibrates_ar_and_lookup(engine: Any, tmp_path: Path) -> None:
    from toolflash.calibrate import CalibrationPlan, ensure_calibrated
    from toolflash.engine.service import DFlashEngine
    from toolflash.policy.estimates import POOL

    alone = DFlashEngine(
        engine.target, engine.tokenizer, None, "alone", None, engine.context_length
    )
    plan = CalibrationPlan(**PLAN_KW)  # type: ignore[arg-type]
    policy = _policy(tmp_path)
    record, measured = ensure_calibrated(alone, policy, plan, progress=False)
    assert measured
    timing = [r for r in record.rows if r["row"] == "timing"]
    assert timing and all(r["ar_ms"] > 0 and not r["cycle_ms"] for r in timing)
    est = policy.model("alone").estimates
    block = alone.options.lookup.block_size
    # Lookup seeds each span's pool (a prior), never a class's own estimate.
    assert est.lookup_tokens and all(k[1] == POOL for k in est.lookup_tokens)
    assert ("alone", POOL, "text", block) in est.lookup_tokens
    assert not est.cycle_s and not est.tau


def _first_decision(policy: AdaptivePolicy, model: str, rc: Any, ctx: int, block: int) -> Any:
    ctrl = policy.controller_for(model, rc, rc.kind == "json")
    ctrl.prepare(ctx, block)
    return ctrl.start(ctx, block)


def _serve_args(*argv: str) -> argparse.Namespace:
    from toolflash.commands import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(("argv", "calls"), [((), 1), (("--no-calibrate",), 0)])
def test_serve_calibrates_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...], calls: int
) -> None:
    import toolflash.calibrate
    import toolflash.engine.factory
    from toolflash.commands import serve

    fake = SimpleNamespace(model_id="m", draft_id="d")
    seen: list[Any] = []
    monkeypatch.setattr(toolflash.engine.factory, "build_engine", lambda *a, **k: fake)
    monkeypatch.setattr(
        toolflash.calibrate,
        "ensure_calibrated",
        lambda engine, policy, progress: seen.append((engine, progress)),
    )
    build = serve._engine_factory(_serve_args(*argv), policy=object())
    assert build() is fake
    assert seen == [(fake, False)] * calls  # no progress bar among JSON log lines
    # --policy off: nothing to seed, so nothing is calibrated either.
    seen.clear()
    assert serve._engine_factory(_serve_args(*argv), policy=None)() is fake
    assert seen == []
