"""`toolflash policy show|check`: print the effective decoding policy, or validate a policy file."""

from __future__ import annotations

import argparse
import sys

from toolflash.engine.registry import EMBEDDED_MODEL
from toolflash.policy.config import PolicyConfig, PolicyFileError, load_policy_file

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


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "policy_command", None)
    try:
        if action == "show":
            policy = PolicyConfig(args.config).for_model(args.model)
            sys.stdout.write(policy.to_yaml())
            return 0
        if action == "check":
            parsed, _ = load_policy_file(args.file)
            print(f"{args.file}: ok (models: {', '.join(parsed.models)})")
            return 0
    except PolicyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("usage: toolflash policy {show,check} ...", file=sys.stderr)
    return 2
