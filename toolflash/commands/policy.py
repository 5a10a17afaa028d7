"""`toolflash policy show|check|defaults|reset`: print the effective decoding policy and what it
has learned here, validate a policy file, print the default file rendered from the settings'
declarations, or forget what the policy learned (and its calibrations) for one model or all.

The adaptive policy keeps what it learns across runs, and across installs, in its state
directory (`state_dir` of the policy files, `~/.cache/toolflash` by default; `--state-dir` on
`serve`, `calibrate` and here): `policy-state.json` (estimates per model) and `calibration/`
(one record per model, drafter and machine)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolflash.commands.options import state_file_in
from toolflash.commands.serve_settings import ServeSettings
from toolflash.commands.settings_cli import add_flags
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
    _add_files(show)
    reset = sub.add_parser(
        "reset",
        help="Forget what the policy learned (estimates and calibrations) for a model, or all.",
    )
    reset.add_argument(
        "--model", default=None, help="model id whose state to forget (default: every model)"
    )
    _add_files(reset)
    check = sub.add_parser(
        "check", help="Validate a policy file (exit 1 with file, field, reason)."
    )
    check.add_argument("file", help="policy YAML file")
    sub.add_parser(
        "defaults",
        help="Print every setting with its default and meaning (configs/default.yaml is this).",
    )


def _add_files(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        nargs="+",
        default=[],
        metavar="FILE",
        help="extra policy files, applied after the shipped ones in this order",
    )
    add_flags(p, ServeSettings, only=("state_dir",))


def state_file(args: argparse.Namespace, model: str) -> Path:
    """The state file `serve` would use for `model` with these files and --state-dir."""
    state_dir = getattr(args, "state_dir", None)
    if state_dir:
        return state_file_in(state_dir)
    return PolicyConfig(args.config).for_model(model).state_file()


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "policy_command", None)
    try:
        if action == "show":
            policy = PolicyConfig(args.config).for_model(args.model)
            sys.stdout.write(policy.to_yaml())
            where = state_file(args, args.model)
            sys.stdout.write(state_status(args.model, where))
            sys.stdout.write(calibration_status(args.model, where.parent))
            return 0
        if action == "reset":
            return reset(args.model, state_file(args, args.model or EMBEDDED_MODEL))
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
    print("usage: toolflash policy {show,check,defaults,reset} ...", file=sys.stderr)
    return 2


def state_status(model: str, path: Path) -> str:
    """Comment lines saying what the policy has learned and saved in `path`, for `model` and
    the other models sharing the file."""
    from toolflash.policy.store import PolicyStore

    saved = PolicyStore(path).saved()
    mine = saved.pop(model, 0)
    line = (
        f"# learned: {mine} estimate rows for {model} in {path}"
        if mine
        else f"# learned: nothing for {model} in {path}"
    )
    if saved:
        line += "; also " + ", ".join(f"{m} ({n})" for m, n in sorted(saved.items()))
    return line + " (`toolflash policy reset [--model M]` forgets it)\n"


def reset(model: str | None, path: Path) -> int:
    """Forget `model`'s (or every model's) saved estimates and calibration records."""
    from toolflash.policy.calibration import record_dir, records_for
    from toolflash.policy.store import PolicyStore

    try:
        forgotten = PolicyStore(path).forget(model)
        if model is None:
            root = record_dir(path.parent)
            records = sorted(root.glob("*.json")) if root.is_dir() else []
        else:
            records = [p for p, _ in records_for(path.parent, model)]
        for record in records:
            record.unlink(missing_ok=True)
    except OSError as exc:
        print(f"toolflash policy reset: {exc}", file=sys.stderr)
        return 1
    who = model or "every model"
    if not forgotten and not records:
        print(f"nothing learned for {who} in {path.parent}")
        return 0
    print(
        f"forgot {who}: estimates of {', '.join(forgotten) or 'none'} in {path}; "
        f"{len(records)} calibration record(s) in {record_dir(path.parent)}"
    )
    return 0


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
