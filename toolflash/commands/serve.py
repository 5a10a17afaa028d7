"""`toolflash serve`: the OpenAI-compatible gateway on uvicorn.

The engine is built on the engine worker thread once the server is up, so /health answers 503
while the model loads and 200 when it is ready; a failed load stops the server (exit code 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import sys
from typing import Any

from toolflash.commands.options import add_draft_length, add_policy_config
from toolflash.gateway.config import GatewayConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="target: local dir, hub id or embedded pair (default toolflash-tiny-qwen35)",
    )
    p.add_argument("--draft", default=None, help="DFlash drafter (default: from the registry)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=os.environ.get("TOOLFLASH_API_KEY"),
        help="require 'Authorization: Bearer KEY' (env TOOLFLASH_API_KEY); mandatory when "
        "--host is not a loopback address",
    )
    p.add_argument(
        "--mode", choices=("spec", "ar"), default="spec", help="decoding mode to start in"
    )
    p.add_argument("--block-size", type=int, default=None, help="speculative block size")
    add_draft_length(p)
    p.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait for the engine (429 past it)",
    )
    p.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        help="extra name clients may use for the model (repeatable)",
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=8192,
        help="output cap when a request names none (it otherwise fills the context)",
    )
    p.add_argument(
        "--max-body-mb",
        type=float,
        default=GatewayConfig.max_body_bytes / (1024 * 1024),
        help="request body limit (413 past it)",
    )
    add_config_flags(p)
    p.add_argument("--log-format", choices=("json", "console"), default="json")
    p.add_argument("--log-level", default="info")
    p.add_argument("--no-cache", action="store_true", help="disable the prefix cache")
    p.add_argument("--cache-entries", type=int, default=32, help="L1 (RAM) snapshot entries")
    p.add_argument("--cache-ram-mb", type=float, default=2048, help="L1 (RAM) byte budget")
    p.add_argument("--cache-dir", default=None, help="L2 (disk) snapshot directory (off if unset)")
    p.add_argument("--cache-disk-mb", type=float, default=8192, help="L2 (disk) byte budget")
    p.add_argument(
        "--cache-disk-min-gain",
        type=int,
        default=256,
        help="read a disk snapshot instead of a RAM hit when it covers at least this many "
        "more prompt tokens",
    )
    p.add_argument(
        "--policy",
        choices=("adaptive", "off"),
        default="adaptive",
        help="adaptive: choose spec/AR and block size per request class and span from "
        "measurements (configs/*.yaml); off: always --mode",
    )
    add_policy_config(p)
    p.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip calibration on the first serve of a model on this machine (the adaptive "
        "policy then learns from requests alone; see `toolflash calibrate`)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="YAML file with any of these options (keys like max_queue or max-queue); "
        "flags given on the command line win",
    )


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """One flag per `GatewayConfig` setting that declares a `help` (its name, dashed; its
    default and type from the declaration), so each setting is declared once."""
    for f in dataclasses.fields(GatewayConfig):
        if "help" not in f.metadata:
            continue
        flag, default = f"--{f.name.replace('_', '-')}", f.default
        if isinstance(default, tuple):  # a list: repeatable and comma-separated (YAML lists too)
            p.add_argument(
                flag,
                type=_comma_list,
                action="append",
                default=None,
                help=f"{f.metadata['help']} (default: {','.join(default)})",
            )
        else:
            p.add_argument(
                flag,
                type=type(default),
                default=default,
                help=f"{f.metadata['help']} (default: {default})",
            )


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The gateway settings these arguments give."""
    derived: dict[str, Any] = {}
    for f in dataclasses.fields(GatewayConfig):
        if "help" in f.metadata:
            value = getattr(args, f.name)
            if isinstance(f.default, tuple):
                value = f.default if value is None else tuple(x for xs in value for x in xs)
            derived[f.name] = value
    return GatewayConfig(
        mode=args.mode,
        block_size=args.block_size,
        max_queue=args.max_queue,
        api_key=args.api_key,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        default_max_tokens=args.default_max_tokens,
        served_model_names=tuple(args.served_model_name),
        **derived,
    )


def apply_config(args: argparse.Namespace, path: str) -> argparse.Namespace:
    """Fill options from a YAML mapping; values go through the same parser (types, choices),
    and an option set on the command line (differing from its default) keeps its value."""
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values")
    parser = argparse.ArgumentParser(prog="toolflash serve", exit_on_error=False)
    add_arguments(parser)
    defaults = vars(parser.parse_args([]))
    argv: list[str] = []
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in defaults or name == "config":
            raise ValueError(f"{path}: unknown option {key!r}")
        for item in value if isinstance(value, list) else [value]:
            argv += [f"--{name.replace('_', '-')}", str(item)]
    try:
        from_file = vars(parser.parse_args(argv))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"{path}: {exc}") from None
    merged = vars(args).copy()
    for key in data:
        name = str(key).replace("-", "_")
        if merged.get(name) == defaults[name]:
            merged[name] = from_file[name]
    return argparse.Namespace(**merged)


def is_loopback(host: str) -> bool:
    """True for loopback addresses and 'localhost'."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _engine_factory(args: argparse.Namespace, policy: Any = None) -> Any:
    """The engine builder the worker thread runs. With an adaptive `policy`, the first serve
    of a pair on this machine also calibrates it there (unless --no-calibrate), while
    /health still answers "loading"."""

    def build() -> Any:
        from toolflash.cache.prefix_cache import CacheConfig
        from toolflash.engine.factory import build_engine

        cache = CacheConfig(
            enabled=not args.no_cache,
            l1_entries=args.cache_entries,
            l1_bytes=int(args.cache_ram_mb * 1024 * 1024),
            l2_dir=args.cache_dir,
            l2_bytes=int(args.cache_disk_mb * 1024 * 1024),
            l2_min_gain_tokens=args.cache_disk_min_gain,
        )
        engine = build_engine(
            args.model,
            args.draft,
            mode=args.mode,
            block_size=args.block_size,
            draft_length=args.draft_length,
            cache=cache,
        )
        if policy is not None and not args.no_calibrate:
            _calibrate(engine, policy)
        return engine

    return build


def _calibrate(engine: Any, policy: Any) -> None:
    """Calibrate the pair unless a valid calibration exists (`toolflash.calibrate`). A failure
    is logged and the server goes on: the policy then learns from requests alone."""
    import structlog

    from toolflash.calibrate import ensure_calibrated

    if engine.draft_id is None:
        return
    try:
        ensure_calibrated(engine, policy)
    except Exception:
        structlog.get_logger("toolflash.serve").exception("calibration.failed")


def _policy(args: argparse.Namespace) -> Any:
    """The adaptive policy (one per server), or None with --policy off."""
    if args.policy == "off":
        return None
    from toolflash.policy.adaptive import AdaptivePolicy
    from toolflash.policy.config import PolicyConfig

    return AdaptivePolicy(PolicyConfig(list(args.policy_config)))


def build_server(args: argparse.Namespace) -> tuple[Any, list[BaseException]]:
    """The uvicorn server for these arguments, and the list a failed engine load lands in
    (the load failure also stops the server)."""
    import uvicorn

    from toolflash.gateway.app import create_app

    config = config_from_args(args)
    failed: list[BaseException] = []
    holder: list[uvicorn.Server] = []

    def on_load_failure(exc: BaseException) -> None:
        failed.append(exc)
        for server in holder:
            server.should_exit = True

    policy = _policy(args)
    app = create_app(
        _engine_factory(args, policy),
        config,
        on_load_failure=on_load_failure,
        controller_factory=(
            (
                lambda r: policy.controller_for(
                    r.model_id,
                    r.request_class,
                    r.response_format_json,
                    start_in_reasoning=r.start_in_reasoning,
                )
            )
            if policy is not None
            else None
        ),
        policy_counters=policy.counters if policy is not None else None,
        on_shutdown=policy.save if policy is not None else None,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            access_log=False,
            log_level=args.log_level,
            timeout_graceful_shutdown=5,
        )
    )
    holder.append(server)
    return server, failed


def run(args: argparse.Namespace) -> int:
    from toolflash.gateway.logs import configure_logging

    if args.config:
        try:
            args = apply_config(args, args.config)
        except (OSError, ValueError) as exc:
            print(f"toolflash serve: {exc}", file=sys.stderr)
            return 2
    if not is_loopback(args.host) and not args.api_key:
        print(
            f"toolflash serve: binding {args.host} (not loopback) requires --api-key "
            "(or TOOLFLASH_API_KEY)",
            file=sys.stderr,
        )
        return 2
    if args.max_queue < 1:
        print("toolflash serve: --max-queue must be at least 1", file=sys.stderr)
        return 2
    configure_logging(json_lines=args.log_format == "json", level=args.log_level)
    server, failed = build_server(args)
    server.run()
    if failed:
        print(f"toolflash serve: the engine failed to load: {failed[0]}", file=sys.stderr)
        return 1
    return 0
