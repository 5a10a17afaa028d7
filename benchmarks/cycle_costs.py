"""Cost of the pieces of a speculative cycle relative to one AR step, at real model shapes.

Random weights (acceptance is not measured here): for each target shape this times, at a
given context length, one target-only step, the verify forward of a block, the draft call and
the rollback, through toolflash's own session code, and prints the break-even tokens per
cycle ((draft + verify + rollback) / AR step), and the prefill time of the context. Hybrid
shapes run once per GatedDeltaNet recurrence named in `--recurrence` (the chunked default and
the step-by-step reference), side by side in one process. Run it on the machine you care
about, e.g. `python benchmarks/cycle_costs.py --shapes qwen3-4b,qwen3.5-9b --context 1024`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import mlx.core as mx
from script_env import ensure_optimized_blas_for_script

from toolflash.engine.drafter import DFlashDrafter, DraftConfig
from toolflash.engine.session import GenerationSession
from toolflash.engine.targets.qwen3 import Qwen3Target
from toolflash.engine.targets.qwen3_5 import Qwen35Target
from toolflash.kernels import gated_delta

RECURRENCES = {"chunked": gated_delta.recurrence_chunked, "ops": gated_delta.recurrence_ops}

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "family": "qwen3",
        "hidden": 256,
        "layers": 4,
        "heads": 4,
        "kv": 2,
        "head_dim": 64,
        "inter": 768,
        "vocab": 4096,
    },
    "tiny-hybrid": {  # the shipped qwen35-tiny's shape
        "family": "qwen3_5",
        "hidden": 192,
        "layers": 4,
        "heads": 3,
        "kv": 1,
        "head_dim": 64,
        "inter": 576,
        "vocab": 4096,
        "lin_k_heads": 2,
        "lin_v_heads": 4,
        "lin_k_dim": 32,
        "lin_v_dim": 64,
        "attention_interval": 2,
    },
    "qwen3-4b": {
        "family": "qwen3",
        "hidden": 2560,
        "layers": 36,
        "heads": 32,
        "kv": 8,
        "head_dim": 128,
        "inter": 9728,
        "vocab": 151936,
    },
    "qwen3-8b": {
        "family": "qwen3",
        "hidden": 4096,
        "layers": 36,
        "heads": 32,
        "kv": 8,
        "head_dim": 128,
        "inter": 12288,
        "vocab": 151936,
    },
    "qwen3.5-9b": {
        "family": "qwen3_5",
        "hidden": 4096,
        "layers": 32,
        "heads": 16,
        "kv": 4,
        "head_dim": 256,
        "inter": 12288,
        "vocab": 248320,
        "lin_k_heads": 16,
        "lin_v_heads": 32,
        "lin_k_dim": 128,
        "lin_v_dim": 128,
    },
}


def _decoder_config(shape: dict[str, Any]) -> dict[str, Any]:
    """The decoder keys both families' configs share."""
    return {
        "hidden_size": shape["hidden"],
        "num_hidden_layers": shape["layers"],
        "intermediate_size": shape["inter"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv"],
        "head_dim": shape["head_dim"],
        "rms_norm_eps": 1e-6,
        "vocab_size": shape["vocab"],
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    }


def qwen3_config(shape: dict[str, Any]) -> dict[str, Any]:
    """The HF-style config of a qwen3-family shape (what mlx-lm's loader reads)."""
    return {"model_type": "qwen3", **_decoder_config(shape), "rope_theta": 1e6}


def qwen35_config(shape: dict[str, Any]) -> dict[str, Any]:
    """The config of a hybrid (qwen3_5-family) shape, as mlx-lm's loader reads it."""
    text = {
        "model_type": "qwen3_5_text",
        **_decoder_config(shape),
        "linear_num_value_heads": shape["lin_v_heads"],
        "linear_num_key_heads": shape["lin_k_heads"],
        "linear_key_head_dim": shape["lin_k_dim"],
        "linear_value_head_dim": shape["lin_v_dim"],
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": shape.get("attention_interval", 4),
    }
    return {"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": False}


def build_target(shape: dict[str, Any], dtype: mx.Dtype) -> Any:
    from mlx_lm.models import qwen3, qwen3_5

    if shape["family"] == "qwen3":
        model = qwen3.Model(qwen3.ModelArgs.from_dict(qwen3_config(shape)))
        adapter_cls: Any = Qwen3Target
    else:
        model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(qwen35_config(shape)))
        adapter_cls = Qwen35Target
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return adapter_cls(model)


def build_drafter(shape: dict[str, Any], layers: int, block: int, dtype: mx.Dtype) -> DFlashDrafter:
    n = shape["layers"]
    ids = [round(1 + i * (n - 4) / 4) for i in range(5)]
    # Published Qwen3.5 drafts use 32 heads x 128 (8 KV) whatever the target's attention.
    own = shape["family"] == "qwen3" or shape["hidden"] < 1024
    cfg = DraftConfig.from_dict(
        {
            "hidden_size": shape["hidden"],
            "num_hidden_layers": layers,
            "num_attention_heads": shape["heads"] if own else 32,
            "num_key_value_heads": shape["kv"] if own else 8,
            "head_dim": shape["head_dim"] if own else 128,
            "intermediate_size": shape["inter"],
            "vocab_size": shape["vocab"],
            "block_size": block,
            "num_target_layers": n,
            "rope_theta": 1e6,
            "dflash_config": {"mask_token_id": shape["vocab"] - 1, "target_layer_ids": ids},
        }
    )
    drafter = DFlashDrafter(cfg)
    drafter.set_dtype(dtype)
    mx.eval(drafter.parameters())
    return drafter


def measure(
    target: Any, drafter: DFlashDrafter, vocab: int, context: int, block: int, steps: int
) -> dict[str, Any]:
    """AR step, draft, verify and rollback medians (ms) and the prefill time at `context`."""
    prompt = [int(x) for x in mx.random.randint(0, vocab - 2, (context,)).tolist()]
    out: dict[str, Any] = {"context": context, "block": block}
    for mode in ("ar", "spec"):
        session = GenerationSession(target, drafter)
        t0 = time.perf_counter()
        session.prefill(prompt)
        out[f"prefill_ms_{mode}"] = 1000 * (time.perf_counter() - t0)
        for _ in range(3):  # warm-up
            session.step(mode, block, lambda c: None)
        records = [session.step(mode, block, lambda c: None).record for _ in range(steps)]
        if mode == "ar":
            out["ar_step_ms"] = 1000 * statistics.median(r.total_s for r in records)
        else:
            out["draft_ms"] = 1000 * statistics.median(r.draft_s for r in records)
            out["verify_ms"] = 1000 * statistics.median(r.verify_s for r in records)
            out["rollback_ms"] = 1000 * statistics.median(r.rollback_s for r in records)
    # The first prefill also pays first-call compilation; the second is the figure.
    out["prefill_ms"] = out.pop("prefill_ms_spec")
    out.pop("prefill_ms_ar")
    cycle = out["draft_ms"] + out["verify_ms"] + out["rollback_ms"]
    out["verify_over_ar"] = out["verify_ms"] / out["ar_step_ms"]
    out["break_even_tokens_per_cycle"] = cycle / out["ar_step_ms"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default="tiny")
    p.add_argument("--context", default="1024", help="comma-separated context lengths")
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--recurrence",
        default="chunked,ops",
        help="GatedDeltaNet recurrences to compare on hybrid shapes (chunked, ops)",
    )
    p.add_argument("--json", dest="json_out", default=None)
    args = p.parse_args()
    dtype = getattr(mx, args.dtype)
    recurrences = args.recurrence.split(",")
    unknown = set(recurrences) - set(RECURRENCES)
    if unknown:
        raise SystemExit(
            f"--recurrence: unknown {sorted(unknown)}; choose from {sorted(RECURRENCES)}"
        )
    rows = []
    t0 = time.time()
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        target = build_target(shape, dtype)
        drafter = build_drafter(shape, 1 if name.startswith("tiny") else 5, args.block, dtype)
        kinds = recurrences if shape["family"] == "qwen3_5" else ["-"]
        for ctx in (int(c) for c in args.context.split(",")):
            for kind in kinds:
                gated_delta.set_backend(RECURRENCES.get(kind))
                row = {"shape": name, "recurrence": kind}
                row.update(measure(target, drafter, shape["vocab"], ctx, args.block, args.steps))
                rows.append(row)
                print(
                    f"{name:<12} {kind:<8} ctx={ctx:<6} prefill {row['prefill_ms']:8.1f} ms  "
                    f"AR {row['ar_step_ms']:7.2f} ms  draft {row['draft_ms']:6.2f}  verify "
                    f"{row['verify_ms']:7.2f} ({row['verify_over_ar']:.2f}x AR)  rollback "
                    f"{row['rollback_ms']:5.2f}  break-even tau "
                    f"{row['break_even_tokens_per_cycle']:.2f}",
                    flush=True,
                )
    gated_delta.set_backend(None)
    report = {
        "device": str(mx.default_device()),
        "dtype": args.dtype,
        "rows": rows,
        "wall_s": round(time.time() - t0, 1),
    }
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    ensure_optimized_blas_for_script()
    main()
