"""`toolflash generate`: stream one generation, then print speed and acceptance."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import get_args

from toolflash.commands.options import add_draft_length
from toolflash.engine.api import FinishEvent, GenerationRequest, Mode, SamplingParams


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="target: local dir, hub id or an embedded pair (default: toolflash-tiny-qwen35)",
    )
    p.add_argument("--draft", default=None, help="DFlash drafter dir or hub id")
    p.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--no-think", action="store_true", help="enable_thinking=False")
    p.add_argument(
        "--mode",
        choices=get_args(Mode),
        default="spec",
        help="spec: DFlash; ar: the target alone; lookup: drafts copied from the prompt and"
        " output (no drafter needed)",
    )
    p.add_argument("--block-size", type=int, default=None)
    add_draft_length(p)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 is greedy (default: the model's generation_config.json, else 0)",
    )
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="reproducible sampling")


def _sampling(args: argparse.Namespace, defaults: Mapping[str, float]) -> SamplingParams:
    """Flags, else the model's defaults, else greedy (as the gateway merges a request)."""

    def pick(name: str, value: float | None, neutral: float) -> float:
        return float(value) if value is not None else float(defaults.get(name, neutral))

    return SamplingParams(
        temperature=pick("temperature", args.temperature, 0.0),
        top_p=pick("top_p", args.top_p, 1.0),
        top_k=int(pick("top_k", args.top_k, 0)),
        min_p=pick("min_p", args.min_p, 0.0),
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    from toolflash.engine.factory import build_engine

    engine = build_engine(args.model, args.draft, mode=args.mode, block_size=args.block_size)
    if args.raw:
        prompt = engine.encode(args.prompt)
    else:
        kwargs = {"enable_thinking": False} if args.no_think else {}
        prompt = engine.encode_chat([{"role": "user", "content": args.prompt}], None, kwargs)
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=args.max_tokens,
        mode=args.mode,
        block_size=args.block_size,
        draft_length=args.draft_length,
        sampling=_sampling(args, engine.generation_defaults),
    )
    finish = None
    for event in engine.generate(request):
        if isinstance(event, FinishEvent):
            finish = event
        else:
            sys.stdout.write(event.text)
            sys.stdout.flush()
    assert finish is not None
    s = finish.stats
    spec = [c for c in s.cycles if c.speculative]
    print("\n---", file=sys.stderr)
    print(
        f"finish={finish.finish_reason} prompt={s.prompt_tokens} tokens={s.completion_tokens} "
        f"prefill={s.prefill_s * 1000:.1f}ms decode={s.decode_tokens_per_s:.1f} tok/s",
        file=sys.stderr,
    )
    if spec:
        drafted = sum(c.drafted for c in spec)
        accepted = sum(c.accepted for c in spec)
        print(
            f"mode={'+'.join(s.modes)} cycles={len(spec)} tokens/cycle={s.tokens_per_cycle:.2f} "
            f"accepted={accepted}/{drafted} ({100 * accepted / max(1, drafted):.1f}% of drafted)",
            file=sys.stderr,
        )
    else:
        print("mode=ar", file=sys.stderr)
    return 0
