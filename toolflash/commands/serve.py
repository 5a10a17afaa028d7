"""`toolflash serve`: the OpenAI-compatible gateway on uvicorn.

The engine is built on the engine worker thread once the server is up, so /health answers 503
while the model loads and 200 when it is ready; a failed load stops the server (exit code 1).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from typing import Any

from toolflash.cache.config import CacheConfig
from toolflash.commands import serve_distributed
from toolflash.commands.options import adaptive_policy, policy_state_file
from toolflash.commands.serve_settings import SECTIONS, ServeSettings
from toolflash.commands.settings_cli import (
    SettingsError,
    add_flags,
    settings_from_args,
    settings_markdown,
    settings_yaml,
)
from toolflash.gateway.config import GatewayConfig
from toolflash.gateway.upstream_config import load_upstreams


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per setting of `SECTIONS` (declared once, in their models), plus --config."""
    for title, model in SECTIONS:
        add_flags(p.add_argument_group(title), model)
    p.add_argument(
        "--config",
        default=None,
        help="YAML file with any of these settings (keys like max_queue or max-queue; "
        "`toolflash serve --defaults` prints one with every default); flags given on the "
        "command line win",
    )
    p.add_argument(
        "--defaults",
        nargs="?",
        const="yaml",
        choices=("yaml", "markdown"),
        default=None,
        help="print every setting with its default and meaning (as a --config file, or as "
        "SETTINGS.md's tables) and exit",
    )


def defaults_text(form: str) -> str:
    """`toolflash serve --defaults [yaml|markdown]`: rendered from the declarations."""
    if form == "markdown":
        return SETTINGS_HEADER + settings_markdown(SECTIONS)
    return settings_yaml([model for _, model in SECTIONS])


SETTINGS_HEADER = """\
# toolflash serve settings

Generated from the settings' declarations (`toolflash serve --defaults markdown > SETTINGS.md`):
each is declared once, in the pydantic model named under its heading, and its flag, config-file
key, default and help are derived from it. Every key also works in a `--config` YAML file
(`toolflash serve --defaults` prints one). The decoding policy's settings are in its own files:
`toolflash policy defaults`.
"""


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The gateway settings these arguments give."""
    return settings_from_args(GatewayConfig, args)


def cache_config(args: argparse.Namespace) -> CacheConfig:
    """The prefix cache's settings these arguments give."""
    return settings_from_args(CacheConfig, args)


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The server process's settings these arguments give."""
    return settings_from_args(ServeSettings, args)


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
        if name not in defaults or name in ("config", "defaults"):
            raise ValueError(f"{path}: unknown option {key!r}")
        flag = f"--{name.replace('_', '-')}"
        if isinstance(defaults[name], bool):  # a switch: true sets it
            argv += [flag] if value else []
            continue
        for item in value if isinstance(value, list) else [value]:
            argv += [] if item is None else [flag, str(item)]
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


def _engine_factory(
    args: argparse.Namespace, policy: Any = None, pipeline: Any = None, built: list | None = None
) -> Any:
    """The engine builder the worker thread runs. With an adaptive `policy`, the first serve
    of a pair on this machine also calibrates it there (unless --no-calibrate), while
    /health still answers "loading". `pipeline`: the distributed group (this process its
    rank 0); the engine built lands in `built`."""
    settings, gateway, cache = serve_settings(args), config_from_args(args), cache_config(args)

    def build() -> Any:
        from toolflash.engine.factory import build_engine

        engine = build_engine(
            settings.model,
            settings.draft,
            mode=gateway.mode,
            block_size=gateway.block_size,
            draft_length=settings.draft_length,
            cache=cache,
            pipeline=pipeline,
        )
        if built is not None:
            built.append(engine)
        if policy is not None and settings.calibrate:
            _calibrate(engine, policy, progress=_bar_fits(settings))
        return engine

    return build


def _bar_fits(settings: ServeSettings) -> bool:
    """A progress bar belongs among console lines on a terminal, never in JSON lines or a file."""
    from toolflash.gateway.logs import is_terminal

    return settings.log_format == "console" and is_terminal(sys.stderr)


def _calibrate(engine: Any, policy: Any, progress: bool = False) -> None:
    """Calibrate the pair unless a valid calibration exists (`toolflash.calibrate`). A failure
    is logged and the server goes on: the policy then learns from requests alone."""
    import structlog

    from toolflash.calibrate import ensure_calibrated

    try:
        ensure_calibrated(engine, policy, progress=progress)
    except Exception:
        structlog.get_logger("toolflash.serve").exception("calibration.failed")


def _policy(args: argparse.Namespace) -> Any:
    """The adaptive policy (one per server), or None with --policy off."""
    settings = serve_settings(args)
    if settings.policy == "off":
        return None
    return adaptive_policy(settings.policy_config, settings.state_dir)


def startup_plan(settings: ServeSettings, gateway: GatewayConfig, policy: Any) -> dict[str, Any]:
    """What the server will do, for its first log line: which decoding, where the policy's state
    lives, whether it calibrates, the cache."""
    from toolflash.engine.registry import EMBEDDED_MODEL

    plan: dict[str, Any] = {"model": settings.model or EMBEDDED_MODEL}
    if policy is None:
        plan["decoding"] = f"{gateway.mode} on every request (--policy off)"
    else:
        plan["decoding"] = (
            "adaptive policy: the arm (spec, AR, or lookup where the policy files allow it) "
            "and block size chosen per request class and span from measurements"
        )
        plan["policy_state"] = str(policy_state_file(policy, plan["model"]))
        plan["calibrate"] = "on first serve" if settings.calibrate else "off (--no-calibrate)"
    plan["draft_length"] = settings.draft_length
    if gateway.block_size is not None:
        plan["block_size"] = gateway.block_size
    return plan


def _pipeline_failure(built: list | None) -> Any:
    """/health's check of a distributed target (rank 0): why it can serve no more, or None."""
    from toolflash.engine.distributed import pipeline_failure

    return lambda: pipeline_failure(built or [])


def build_server(
    args: argparse.Namespace, pipeline: Any = None, built: list | None = None
) -> tuple[Any, list[BaseException]]:
    """The uvicorn server for these arguments, and the list a failed engine load lands in
    (the load failure also stops the server). `pipeline`, `built`: as `_engine_factory`'s."""
    import structlog
    import uvicorn

    from toolflash.gateway.app import create_app

    settings, config = serve_settings(args), config_from_args(args)
    if pipeline is not None:  # a pipeline target runs one sequence at a time (no batching)
        config = config.model_copy(update={"max_batch": 1})
    failed: list[BaseException] = []
    holder: list[uvicorn.Server] = []

    def on_load_failure(exc: BaseException) -> None:
        failed.append(exc)
        for server in holder:
            server.should_exit = True

    upstreams = load_upstreams(settings.upstreams) if settings.upstreams else None
    policy = _policy(args) if settings.local_model else None
    plan = startup_plan(settings, config, policy) if settings.local_model else {}
    if upstreams is not None:
        plan["upstreams"] = {
            p.pool_name: {"model": p.model, "urls": list(p.urls)} for p in upstreams.pools
        }
        plan["upstream_route"] = upstreams.route
    structlog.get_logger("toolflash.serve").info("serve_starting", **plan)
    app = create_app(
        _engine_factory(args, policy, pipeline, built) if settings.local_model else None,
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
        sparse_policy=policy.sparse_prefill if policy is not None else None,
        policy_counters=policy.counters if policy is not None else None,
        on_shutdown=policy.save if policy is not None else None,
        upstreams=upstreams,
        engine_failure=_pipeline_failure(built) if pipeline is not None else None,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            access_log=False,
            log_level=settings.log_level,
            timeout_graceful_shutdown=5,
        )
    )
    holder.append(server)
    return server, failed


def run(args: argparse.Namespace) -> int:
    from toolflash.gateway.logs import configure_logging

    if args.defaults:
        sys.stdout.write(defaults_text(args.defaults))
        return 0
    if args.config:
        try:
            args = apply_config(args, args.config)
        except (OSError, ValueError) as exc:
            print(f"toolflash serve: {exc}", file=sys.stderr)
            return 2
    try:
        settings, config = serve_settings(args), config_from_args(args)
        cache_config(args)
        if settings.upstreams:
            load_upstreams(settings.upstreams)
        elif not settings.local_model:
            raise SettingsError("--no-local-model needs --upstreams")
        if settings.distributed and not settings.local_model:
            raise SettingsError("--distributed splits the local model: not with --no-local-model")
        if settings.distributed_backend and not settings.distributed:
            raise SettingsError("--distributed-backend needs --distributed HOSTFILE")
        backend = (
            serve_distributed.backend_for(settings.distributed, settings.distributed_backend)
            if settings.distributed
            else None
        )
    except (SettingsError, ValueError) as exc:
        print(f"toolflash serve: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(settings.host) and not config.api_key:
        print(
            f"toolflash serve: binding {settings.host} (not loopback) requires --api-key "
            "(or TOOLFLASH_API_KEY)",
            file=sys.stderr,
        )
        return 2
    if settings.distributed and not serve_distributed.is_rank():
        try:
            return serve_distributed.launch(settings.distributed, sys.argv[1:], backend or "ring")
        except SettingsError as exc:
            print(f"toolflash serve: {exc}", file=sys.stderr)
            return 2
    configure_logging(json_lines=settings.log_format == "json", level=settings.log_level)
    pipeline: Any = None
    built: list[Any] = []
    if settings.distributed:
        from toolflash.engine.api import EngineError
        from toolflash.engine.distributed import init_group, serve_rank

        try:
            serve_distributed.rank_env(settings.distributed, backend or "ring")
            pipeline = init_group(backend=backend or "ring")
        except (EngineError, SettingsError) as exc:
            print(f"toolflash serve: {exc}", file=sys.stderr)
            return 1
        if pipeline.rank != 0:
            return serve_rank(settings.model, pipeline)
    server, failed = build_server(args, pipeline, built)
    server.run()
    if pipeline is not None:
        for engine in built:  # the other ranks stop with rank 0
            engine.target.close()
    if failed:
        print(f"toolflash serve: the engine failed to load: {failed[0]}", file=sys.stderr)
        return 1
    return 0
