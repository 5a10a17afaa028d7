"""Options shared by several subcommands."""

from __future__ import annotations

import argparse
from typing import get_args

from toolflash.engine.api import DraftLength


def add_draft_length(p: argparse.ArgumentParser) -> None:
    """`--draft-length adaptive|fixed` (engine/draft_length.py)."""
    p.add_argument(
        "--draft-length",
        choices=get_args(DraftLength),
        default="adaptive",
        help="adaptive (default): a cycle drafts less after rejected drafts and back up to the "
        "block after accepted ones; fixed: every cycle drafts the whole block (a policy's "
        "block is the ceiling either way)",
    )


def add_policy_config(p: argparse.ArgumentParser) -> None:
    """`--policy-config FILE` (repeatable): policy YAML files after the shipped ones."""
    p.add_argument("--policy-config", action="append", default=[], help="extra policy YAML file(s)")
