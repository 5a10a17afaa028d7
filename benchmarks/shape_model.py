"""Write a random-weight target of a real model's shape as a local model folder, so every
benchmark that takes `--model` (and mlx-lm's own loader) can time that shape on a device:

    python benchmarks/shape_model.py --shape qwen3-8b --out /tmp/qwen3-8b-shape
    python benchmarks/shape_model.py --shape qwen3-8b --out M --draft-out M-dflash  # + a drafter

The weights are random (mlx-lm's own initialisation, stored in `--dtype`), so only costs mean
anything: acceptance, text and end-of-turn do not. The tokenizer and chat template are the
embedded tiny family's; the folder keeps the real vocabulary size (the lm_head's cost is part
of the shape), so generated ids beyond the tokenizer decode to nothing. `--draft-out` also writes
a random DFlash drafter of the published drafts' shape (5 layers, block 16, z-lab format), for
the batching benchmarks' speculative rows (acceptance is noise: time per step only). `--bits 4`
quantizes the target as mlx-lm's converter does (affine, group 64): what most MLX users serve,
and a different matmul path (quantized kernels, not GEMM) for the batching figures. Benchmarks
that read text should stop by length (EOS ignored). The shapes are `cycle_costs.SHAPES`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from cycle_costs import SHAPES, build_drafter, build_target, qwen3_config, qwen35_config
from mlx.utils import tree_flatten
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.draft_loading import save_draft

TOKENIZER = Path(__file__).resolve().parent.parent / "toolflash/assets/tiny/qwen3-tiny"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


def config_for(shape: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The config.json mlx-lm's loader reads for this shape. The weights are saved under
    mlx-lm's own names, which both families' `sanitize` keep as they are (the hybrid's
    depthwise convolution already in MLX's layout, its norms already offset)."""
    if shape["family"] == "qwen3":
        arch, config = "Qwen3ForCausalLM", qwen3_config(shape)
    else:
        arch, config = "Qwen3_5ForConditionalGeneration", qwen35_config(shape)
    return {"architectures": [arch], **config, "eos_token_id": 2, "torch_dtype": dtype}


def write(shape_name: str, out: Path, dtype: str, bits: int | None = None) -> Path:
    shape = SHAPES[shape_name]
    config = config_for(shape, dtype)
    mx.random.seed(0)
    model = build_target(shape, DTYPES[dtype]).model
    if bits is not None:
        from mlx_lm.utils import quantize_model

        model, config = quantize_model(model, config, group_size=64, bits=bits)
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER / name, out / name)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--bits", type=int, default=None, choices=(4, 8), help="quantize the target")
    p.add_argument("--draft-out", type=Path, default=None, help="also write a random drafter here")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    write(args.shape, args.out, args.dtype, args.bits)
    if args.draft_out is not None:
        drafter = build_drafter(SHAPES[args.shape], 5, 16, DTYPES[args.dtype])
        save_draft(drafter, args.draft_out)
    size = sum(f.stat().st_size for f in args.out.iterdir()) / 2**30
    print(f"{args.shape} -> {args.out} ({size:.2f} GiB, {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    raise SystemExit(main())
