"""`toolflash doctor`: platform, MLX device, BLAS and its speed, versions, model loadability,
the default pair `serve` would load, and what the adaptive policy has learned on this machine.

Every check reports ok, warn or fail with a reason; the exit code is 1 when any check fails
(a requested model that does not resolve or load, MLX missing, a broken embedded model). The
report is the only output: loaders' log lines and prints are swallowed while checks run (a
failure's reason is in its line).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import io
import json
import logging
import os
import platform
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from toolflash.commands.serve_settings import ServeSettings
from toolflash.commands.settings_cli import add_flags

Status = Literal["ok", "warn", "fail"]

PACKAGES = (
    "mlx",
    "mlx-lm",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "tokenizers",
    "transformers",
    "huggingface-hub",
    "pydantic",
)
OPTIMIZED_BLAS = {"openblas", "mkl", "blis", "accelerate"}
# Below this a float32 CPU matmul is running on a reference BLAS or a starved machine.
SLOW_F32_GFLOPS = 20.0


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    detail: str


@dataclass
class Report:
    """Facts gathered (for --json) and the checks derived from them."""

    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: Status, detail: str) -> None:
        self.checks.append(Check(name, status, detail))

    def guard(self, name: str, fn: Callable[[], tuple[Status, str]]) -> None:
        """Run one check; any exception becomes a fail line carrying its message (a doctor
        must report every problem, not stop at the first)."""
        try:
            status, detail = fn()
        except Exception as exc:
            status, detail = "fail", f"{type(exc).__name__}: {exc}"
        self.add(name, status, detail)

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--model", help="target to check: local directory or hub id")
    parser.add_argument("--draft", help="DFlash draft to check (against --model if given)")
    parser.add_argument(
        "--no-bench", action="store_true", help="skip the matmul GFLOP/s measurement"
    )
    add_flags(parser, ServeSettings, only=("state_dir",))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Only the report is printed: structlog lines (the engine's loading lines), Python logging
    (transformers, huggingface_hub) and the loaders' prints are dropped meanwhile."""
    from toolflash.gateway.logs import flush_logs

    sink = io.StringIO()
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            try:
                yield
            finally:
                flush_logs()  # lines queued meanwhile are written into the sink
    finally:
        logging.disable(logging.NOTSET)


def run(args: argparse.Namespace) -> int:
    report = Report()
    with quiet():
        check_platform(report)
        mlx_ok = check_mlx(report)
        if mlx_ok:
            check_blas(report, bench=not args.no_bench)
        check_versions(report)
        if mlx_ok:
            check_embedded(report)
            if args.model or args.draft:
                check_requested(report, args.model, args.draft)
        report.guard("policy", lambda: check_policy_state(report, getattr(args, "state_dir", None)))
    if args.json:
        payload = {
            **report.facts,
            "checks": [asdict(c) for c in report.checks],
            "ok": not report.failed,
        }
        print(json.dumps(payload, indent=2))
    else:
        print(render(report))
    return 1 if report.failed else 0


def render(report: Report) -> str:
    p = report.facts["platform"]
    lines = [
        "toolflash doctor",
        f"  {p['system']} {p['release']} {p['machine']}, {p['cpus']} CPUs, "
        f"Python {p['python']} ({p['executable']})",
    ]
    width = max(len(c.name) for c in report.checks)
    for c in report.checks:
        lines.append(f"  {c.status:<4}  {c.name:<{width}}  {c.detail}")
    return "\n".join(lines)


def check_platform(report: Report) -> None:
    report.facts["platform"] = {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "executable": sys.executable,
    }


def check_mlx(report: Report) -> bool:
    try:
        import mlx.core as mx
    except ImportError as exc:
        report.add("mlx", "fail", f"cannot import mlx: {exc} (pip install 'mlx[cpu]' on Linux)")
        return False
    version = str(getattr(mx, "__version__", "?"))
    device = mx.default_device()
    metal = bool(mx.metal.is_available())
    cuda = bool(mx.cuda.is_available()) if hasattr(mx, "cuda") else False
    report.facts["mlx"] = {
        "version": version,
        "default_device": "gpu" if device == mx.gpu else "cpu",
        "metal": metal,
        "cuda": cuda,
    }
    kind = "gpu" if device == mx.gpu else "cpu"
    report.add(
        "mlx",
        "ok",
        f"mlx {version}, default device {kind} (metal: {'yes' if metal else 'no'}, "
        f"cuda: {'yes' if cuda else 'no'})",
    )
    return True


def check_blas(report: Report, bench: bool) -> None:
    from toolflash.blas import NO_REEXEC_ENV, blas_info, measure_matmul_gflops

    info = blas_info()
    on_cpu = report.facts["mlx"]["default_device"] == "cpu"
    report.facts["blas"] = {"name": info.name, "path": info.path}
    where = f" ({info.path})" if info.path else ""
    if info.name in OPTIMIZED_BLAS or not on_cpu:
        report.add("blas", "ok", f"{info.name}{where}")
    else:
        hint = (
            f"; {NO_REEXEC_ENV} is set"
            if os.environ.get(NO_REEXEC_ENV)
            else "; install Debian's libopenblas0-pthread and toolflash preloads it"
        )
        report.add("blas", "warn", f"{info.name}{where}: slow CPU matmuls{hint}")
    if not bench:
        return
    # bf16 runs MLX's own (slow) CPU kernel: a smaller matrix keeps the doctor quick.
    sizes = {"float32": 1024, "bfloat16": 512 if on_cpu else 1024}
    gflops = {dt: measure_matmul_gflops(n, dt) for dt, n in sizes.items()}
    report.facts["blas"]["gflops"] = {dt: round(v, 2) for dt, v in gflops.items()}
    detail = ", ".join(f"{dt} {gflops[dt]:.1f} GFLOP/s (n={n})" for dt, n in sizes.items())
    slow = on_cpu and gflops["float32"] < SLOW_F32_GFLOPS
    report.add("matmul", "warn" if slow else "ok", detail + (" - slow" if slow else ""))


def check_versions(report: Report) -> None:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    report.facts["versions"] = versions
    missing = [n for n, v in versions.items() if v is None]
    shown = ", ".join(f"{n} {v}" for n, v in versions.items() if v)
    if missing:
        report.add("versions", "fail", f"missing: {', '.join(missing)}; found {shown}")
    else:
        report.add("versions", "ok", shown)


# --- models --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedTarget:
    """A target that passed its check: where it is, its config and its adapter family."""

    path: Path
    config: dict[str, Any]
    family: str


def _check_target(path: Path) -> tuple[Status, str, LoadedTarget | None]:
    """Parse the config, check the family has an adapter, build the model with its weights
    attached lazily (names and shapes checked, tensors not read) and load the tokenizer."""
    from mlx_lm.utils import load_config, load_model, load_tokenizer

    from toolflash.engine.factory import TARGET_ADAPTERS, read_model_type

    config = load_config(path)
    model_type = read_model_type(path)
    adapter = TARGET_ADAPTERS.get(model_type)
    if adapter is None:
        supported = ", ".join(sorted(TARGET_ADAPTERS))
        return "fail", f"model_type '{model_type}' is not supported (supported: {supported})", None
    load_model(path, lazy=True, strict=True)
    tokenizer = load_tokenizer(path)
    text = config.get("text_config") or config
    family = str(adapter.family)
    detail = (
        f"{path}: {model_type} (family {family}), hidden {text.get('hidden_size')}, "
        f"{text.get('num_hidden_layers')} layers, vocab {text.get('vocab_size')}, "
        f"tokenizer {len(tokenizer.vocab)} tokens"
    )
    return "ok", detail, LoadedTarget(path, config, family)


def _check_draft(draft: Path, target: LoadedTarget) -> tuple[Status, str]:
    from toolflash.engine.draft_loading import TargetInfo, load_draft

    drafter = load_draft(draft, TargetInfo.from_config(target.config, target.family))
    cfg = drafter.config
    return "ok", (
        f"{draft}: {cfg.num_hidden_layers} layers, block {cfg.block_size}, "
        f"target layers {list(cfg.target_layer_ids)}, mask id {cfg.mask_token_id}"
    )


def _check_draft_config(draft: Path) -> tuple[Status, str]:
    from toolflash.engine.draft_loading import read_draft_config

    cfg = read_draft_config(draft)
    return "warn", (
        f"{draft}: config parses (block {cfg.block_size}, {cfg.num_target_layers} target "
        "layers) but weights were not checked: pass --model to check the pair"
    )


def check_requested(report: Report, model: str | None, draft: str | None) -> None:
    """--model / --draft: resolve (local dir, hub, or an embedded pair's id) and load each."""
    from toolflash.commands.models import TINY_ROOT
    from toolflash.engine.hub import resolve_model_path
    from toolflash.engine.registry import EMBEDDED_PAIRS, find_pair

    if model in EMBEDDED_PAIRS:
        target_dir, draft_dir = EMBEDDED_PAIRS[model]
        model, draft = str(TINY_ROOT / target_dir), draft or str(TINY_ROOT / draft_dir)
    loaded: list[LoadedTarget] = []
    if model:

        def target_check() -> tuple[Status, str]:
            status, detail, target = _check_target(resolve_model_path(model))
            loaded.extend([target] if target else [])
            return status, detail

        report.guard("model", target_check)
        pair = find_pair(model)
        if not draft and pair:
            report.add("draft", "ok", f"published pair: {pair.draft} (pass --draft to check it)")
        elif not draft:
            report.add(
                "draft", "warn", "no published DFlash draft for this model: spec mode needs --draft"
            )
    if not draft:
        return
    if loaded:
        target = loaded[0]
        report.guard("draft", lambda: _check_draft(resolve_model_path(draft), target))
    elif model:
        report.add("draft", "fail", "not checked: the target did not load")
    else:
        report.guard("draft", lambda: _check_draft_config(resolve_model_path(draft)))


def check_embedded(report: Report) -> None:
    """The embedded tiny models: each target loads (lazily), each draft loads against the
    target it was trained for, and the engine builds from the first pair."""
    from toolflash.commands.models import TINY_ROOT, embedded_models

    models = embedded_models()
    report.facts["embedded"] = [asdict(m) for m in models]
    if not models:
        report.add("embedded", "warn", f"none built in {TINY_ROOT} (see `toolflash zoo`)")
        return
    targets: list[LoadedTarget] = []
    for m in (m for m in models if m.role != "draft"):

        def target_check(path: Path = Path(m.path)) -> tuple[Status, str]:
            status, detail, target = _check_target(path)
            targets.extend([target] if target else [])
            return status, detail

        report.guard(f"embedded:{m.name}", target_check)
    pairs: list[tuple[LoadedTarget, Path]] = []
    for m in (m for m in models if m.role == "draft"):
        partner = _partner(Path(m.path), targets)
        if partner is None:
            report.add(f"embedded:{m.name}", "fail", "no embedded target loaded to pair it with")
            continue
        before = len(report.checks)
        report.guard(f"embedded:{m.name}", functools.partial(_check_draft, Path(m.path), partner))
        if report.checks[before].status == "ok":
            pairs.append((partner, Path(m.path)))
    if pairs:
        target, draft = _served_pair(pairs)
        report.guard("engine", functools.partial(_build_engine, target.path, draft))


def _served_pair(pairs: list[tuple[LoadedTarget, Path]]) -> tuple[LoadedTarget, Path]:
    """The pair `toolflash serve` loads with no --model (else the first that loaded)."""
    from toolflash.engine.registry import EMBEDDED_MODEL, EMBEDDED_PAIRS

    target_dir, draft_dir = EMBEDDED_PAIRS[EMBEDDED_MODEL]
    for target, draft in pairs:
        if target.path.name == target_dir and draft.name == draft_dir:
            return target, draft
    return pairs[0]


def _partner(draft: Path, targets: list[LoadedTarget]) -> LoadedTarget | None:
    """The embedded target whose width and depth the draft was trained for (else the first,
    so that load_draft names the mismatch)."""
    if not targets:
        return None
    try:
        raw = json.loads((draft / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return targets[0]
    for target in targets:
        text = target.config.get("text_config") or target.config
        if text.get("hidden_size") == raw.get("hidden_size") and text.get(
            "num_hidden_layers"
        ) == raw.get("num_target_layers"):
            return target
    return targets[0]


def _build_engine(target: Path, draft: Path) -> tuple[Status, str]:
    from toolflash.engine.factory import build_engine
    from toolflash.engine.registry import EMBEDDED_MODEL, EMBEDDED_PAIRS

    engine = build_engine(str(target), str(draft))
    served = EMBEDDED_PAIRS[EMBEDDED_MODEL] == (target.name, draft.name)
    return "ok", (
        f"engine builds from {target.name} + {draft.name}"
        f"{f' (what `toolflash serve` serves as {EMBEDDED_MODEL})' if served else ''} "
        f"(context {engine.context_length}, tool format {engine.tool_call_format})"
    )


# --- the policy's state ----------------------------------------------------------------------


def check_policy_state(report: Report, state_dir: str | None) -> tuple[Status, str]:
    """What the adaptive policy has learned and calibrated on this machine, and where (it
    persists across runs and installs: `toolflash policy reset` forgets it)."""
    from toolflash.commands.options import state_file_in
    from toolflash.engine.registry import EMBEDDED_MODEL
    from toolflash.policy.calibration import record_dir
    from toolflash.policy.config import PolicyConfig
    from toolflash.policy.store import PolicyStore

    path = (
        state_file_in(state_dir)
        if state_dir
        else PolicyConfig().for_model(EMBEDDED_MODEL).state_file()
    )
    saved = PolicyStore(path).saved()
    records = record_dir(path.parent)
    calibrations = len(list(records.glob("*.json"))) if records.is_dir() else 0
    report.facts["policy_state"] = {
        "path": str(path),
        "estimate_rows": saved,
        "calibrations": calibrations,
    }
    if not saved and not calibrations:
        return "ok", f"{path}: nothing learned yet (the first serve of a pair calibrates it)"
    models = ", ".join(f"{m} ({n} rows)" for m, n in sorted(saved.items())) or "no estimates"
    return "ok", (
        f"{path}: {models}; {calibrations} calibration record(s) "
        "(`toolflash policy show --model M`; `toolflash policy reset [--model M]` forgets)"
    )
