"""`benchmarks/shape_model.py`: a random-weight target of a named shape, and with `--draft-out`
a drafter for it, both loadable by the engine as any local pair (the device benchmarks' rows)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import shape_model  # noqa: E402

from toolflash.engine.api import FinishEvent, GenerationRequest, TokenEvent  # noqa: E402
from toolflash.engine.factory import build_engine  # noqa: E402


def test_shape_and_its_drafter_load_as_a_pair(tmp_path: Path) -> None:
    model, draft = tmp_path / "m", tmp_path / "m-dflash"
    argv = ["--shape", "tiny", "--out", str(model), "--draft-out", str(draft), "--dtype", "float32"]
    assert shape_model.main(argv) == 0
    engine = build_engine(str(model), str(draft), mode="spec")
    assert engine.drafter is not None and engine.drafter.config.num_hidden_layers == 5
    request = GenerationRequest((5, 6, 7, 8), 12, mode="spec", ignore_eos=True)
    events = list(engine.generate(request))
    tokens = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
    assert len(tokens) == 12 and isinstance(events[-1], FinishEvent)


def test_a_hybrid_shape_loads_with_the_logits_it_was_built_with(tmp_path: Path) -> None:
    """The hybrid family's folder (mlx-lm names, MLX layouts) loads back through mlx-lm's own
    loader and toolflash's engine to the same model: the same logits as the one written."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    model_dir = tmp_path / "hybrid"
    argv = ["--shape", "tiny-hybrid", "--out", str(model_dir), "--dtype", "float32"]
    assert shape_model.main(argv) == 0
    mx.random.seed(0)  # what `write` seeds before building the model it saves
    built = shape_model.build_target(shape_model.SHAPES["tiny-hybrid"], mx.float32).model
    loaded, _ = load_model(model_dir)
    ids = mx.array([[5, 6, 7, 8, 9, 10]])
    assert mx.allclose(loaded(ids), built(ids), atol=1e-5).item()
    engine = build_engine(str(model_dir), None, mode="ar")
    request = GenerationRequest((5, 6, 7, 8), 6, mode="ar", ignore_eos=True)
    tokens = [t for e in engine.generate(request) if isinstance(e, TokenEvent) for t in e.token_ids]
    assert len(tokens) == 6
