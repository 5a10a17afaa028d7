"""`toolflash policy show|check|defaults`: print the effective decoding policy, validate a policy
file, or print the default file rendered from the settings' declarations."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolflash.engine.registry import EMBEDDED_MODEL
from toolflash.policy.config import (
    PolicyConfig,
    PolicyFileError,
    defaults_yaml,
    load_policy_file,
)

DEFAULT_MODEL = EMBEDDED_MODEL


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="policy_command", metavar="ACTION")
    show = sub.add_parser("show", help="Print the effective policy for a model (YAML).")
    show.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"model id to match files against ({DEFAULT_MODEL})"
    )
    show.add_argument(
        "--config",
        nargs="+",
        default=[],
        metavar="FILE",
        help="extra policy files, applied after the shipped ones in this order",
    )
    check = sub.add_parser(
        "check", help="Validate a policy file (exit 1 with file, field, reason)."
    )
    check.add_argument("file", help="policy YAML file")
    sub.add_parser(
        "defaults",
        help="Print every setting with its default and meaning (configs/default.yaml is this).",
    )


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "policy_command", None)
    try:
        if action == "show":
            policy = PolicyConfig(args.config).for_model(args.model)
            sys.stdout.write(policy.to_yaml())
            sys.stdout.write(calibration_status(args.model, policy.state_file().parent))
            return 0
        if action == "defaults":
            sys.stdout.write(defaults_yaml())
            return 0
        if action == "check":
            parsed, _ = load_policy_file(args.file)
            print(f"{args.file}: ok (models: {', '.join(parsed.models)})")
            return 0
    except PolicyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("usage: toolflash policy {show,check,defaults} ...", file=sys.stderr)
    return 2


def calibration_status(model: str, state_dir: Path) -> str:
    """Comment lines saying which calibrations of `model` exist in the state directory and
    whether each is valid here (same weights, machine and versions)."""
    import time

    from toolflash.calibration_key import calibration_key
    from toolflash.policy.calibration import records_for

    found = records_for(state_dir, model)
    if not found:
        return (
            f"# calibration: none for {model} in {state_dir} (`toolflash calibrate --model "
            f"{model}`, or the first `toolflash serve` of it, measures one)\n"
        )
    lines = []
    for path, record in found:
        changed = record.key.differences(calibration_key(model, record.key.draft))
        state = f"stale ({', '.join(changed)} changed)" if changed else "valid here"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created))
        lines.append(
            f"# calibration: {path}: draft {record.key.draft}, {when}, {record.wall_s:.0f} s, "
            f"mlx {record.key.mlx}, toolflash {record.key.toolflash}: {state}\n"
        )
    return "".join(lines)
