"""The `toolflash` command line: one subcommand per module in `toolflash.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

# Subcommand name -> module in toolflash.commands exposing `add_arguments(parser)` and
# `run(args) -> int`. Modules are imported lazily so `toolflash --help` stays fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "Serve an OpenAI-compatible API (default: the embedded tiny model pair)."),
    "generate": (
        "generate",
        "Generate from a prompt, speculative or target-only, and print speed.",
    ),
    "doctor": (
        "doctor",
        "Report platform, MLX device, BLAS speed, versions, model loadability (the default "
        "pair included) and the policy's state.",
    ),
    "models": (
        "models",
        "List the embedded models and the published target -> DFlash draft pairs.",
    ),
    "train-draft": ("train_draft", "Train a DFlash drafter against a frozen target."),
    "bench": (
        "bench",
        "Speculative vs toolflash's own AR decoding per prompt kind (no flags: the README's "
        "figures); --baseline mlx-lm: against plain mlx-lm.",
    ),
    "policy": (
        "policy",
        "Show the effective decoding policy and what it learned here, forget it (reset), "
        "print its defaults, or validate a policy YAML file.",
    ),
    "calibrate": (
        "calibrate",
        "Measure spec vs AR on this machine and seed the adaptive policy (once per model).",
    ),
    "zoo": (
        "zoo",
        "Build the tiny model family (corpus, tokenizer, targets, drafters) from scratch.",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolflash", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        module = _load(module_name)
        if module is not None:
            module.add_arguments(p)
    return parser


def _load(module_name: str) -> Any:
    try:
        return importlib.import_module(f"toolflash.commands.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"toolflash.commands.{module_name}":
            return None
        raise


def main(argv: list[str] | None = None) -> int:
    from toolflash.blas import ensure_optimized_blas

    argv = list(sys.argv[1:] if argv is None else argv)
    ensure_optimized_blas(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    from toolflash.gateway.logs import configure_logging

    # Logs go to stderr (stdout carries generated text and --json output); `serve`
    # reconfigures for JSON lines.
    configure_logging(json_lines=False, level=os.environ.get("TOOLFLASH_LOG_LEVEL", "info"))
    if not getattr(args, "_module", None):
        parser.print_help()
        return 0
    module = _load(args._module)
    if module is None:
        parser.error(f"the '{args.command}' command is not available in this build")
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
