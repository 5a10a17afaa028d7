"""`toolflash calibrate`: measure this machine and pair, and seed the adaptive policy with it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from toolflash.commands.options import adaptive_policy, add_policy_config, policy_files


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="target (default: the embedded tiny pair)")
    p.add_argument("--draft", default=None, help="DFlash drafter (default: from the registry)")
    p.add_argument(
        "--block-size", type=int, default=None, help="the largest block (as `serve` takes it)"
    )
    add_policy_config(p)
    p.add_argument(
        "--force", action="store_true", help="measure again even if a valid calibration exists"
    )
    p.add_argument("--json", dest="json_out", default=None, help="also write the record here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    from toolflash.calibrate import ensure_calibrated, format_rows, state_dir
    from toolflash.engine.factory import build_engine
    from toolflash.policy.calibration import record_path
    from toolflash.policy.config import PolicyFileError

    try:
        policy = adaptive_policy(policy_files(args), args.state_dir)
    except PolicyFileError as exc:
        print(f"toolflash calibrate: {exc}", file=sys.stderr)
        return 2
    engine = build_engine(args.model, args.draft, block_size=args.block_size)
    record, measured = ensure_calibrated(
        engine, policy, force=args.force, progress=not args.no_progress
    )
    where = state_dir(policy, engine.model_id)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created))
    store = policy.model(engine.model_id).store
    print(f"model={engine.model_id} draft={engine.draft_id}")
    print(format_rows(record.rows))
    print()
    if measured:
        seeded = store.path if store is not None else "memory (persistence off)"
        print(f"measured in {record.wall_s:.1f} s; estimates seeded into {seeded}")
    else:
        print(f"calibrated already ({when}, {record.wall_s:.1f} s); --force measures again")
    print(f"record: {record_path(where, record.key)}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(record.as_dict(), indent=2))
    return 0
