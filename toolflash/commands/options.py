"""Options shared by several subcommands, derived from `toolflash serve`'s declarations
(`serve_settings.ServeSettings`), and the policy they build."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolflash.commands.serve_settings import ServeSettings
from toolflash.commands.settings_cli import add_flags


def add_draft_length(p: argparse.ArgumentParser) -> None:
    """`--draft-length adaptive|fixed` (engine/draft_length.py)."""
    add_flags(p, ServeSettings, only=("draft_length",))


def add_policy_config(p: argparse.ArgumentParser) -> None:
    """`--policy-config FILE` (repeatable) and `--state-dir DIR`: policy YAML files after the
    shipped ones, and where the policy's learned state lives."""
    add_flags(p, ServeSettings, only=("policy_config", "state_dir"))


def policy_files(args: argparse.Namespace) -> list[str]:
    """The `--policy-config` files given (repeatable, comma-separated)."""
    return [f for group in getattr(args, "policy_config", None) or [] for f in group]


def state_file_in(state_dir: str | Path) -> Path:
    """The policy's state file in a state directory (the name the policy files use)."""
    from toolflash.policy.config import PolicyConfig

    name = PolicyConfig(include_shipped=False).for_model("*").state_file().name
    return Path(state_dir).expanduser() / name


def adaptive_policy(files: Sequence[str], state_dir: str | None) -> Any:
    """The adaptive policy from the shipped policy files and `files`; with `state_dir`, its
    learned estimates and calibrations live there instead of the files' `state_dir`."""
    from toolflash.policy.adaptive import AdaptivePolicy
    from toolflash.policy.config import PolicyConfig

    state_file = str(state_file_in(state_dir)) if state_dir else None
    return AdaptivePolicy(PolicyConfig(list(files)), state_file=state_file)


def policy_state_file(policy: Any, model: str) -> Path:
    """Where `policy` keeps `model`'s learned estimates (without loading them)."""
    if policy.state_file:
        return Path(policy.state_file)
    path: Path = policy.config.for_model(model).state_file()
    return path
