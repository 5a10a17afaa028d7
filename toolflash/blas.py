"""Use an optimized BLAS under MLX's CPU build, and report which BLAS MLX uses and its speed.

The Linux `mlx[cpu]` wheel links a bundled reference BLAS (~6 GFLOP/s float32 matmul). When
Debian's OpenBLAS (`libopenblas0-pthread`) is installed, preloading it makes MLX resolve
`cblas_*` there instead (~50x faster on float32). A library can only be preloaded when the
process starts, so `ensure_optimized_blas` re-executes the CLI once with `LD_PRELOAD` set;
`TOOLFLASH_NO_BLAS_REEXEC=1` opts out and a marker variable prevents loops.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

NO_REEXEC_ENV = "TOOLFLASH_NO_BLAS_REEXEC"
MARKER_ENV = "TOOLFLASH_BLAS_REEXEC"

# Debian/Ubuntu (pthread variant first: MLX calls BLAS from its own threads), Fedora, Arch.
KNOWN_OPENBLAS_PATHS: tuple[str, ...] = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

_TRUTHY = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class ReexecPlan:
    """Whether to re-execute with `library` preloaded, and why (for logs and tests)."""

    library: str | None
    reason: str


def plan_blas_reexec(
    platform: str,
    env: Mapping[str, str],
    is_cli_process: bool,
    mlx_cpu_build: Callable[[], bool],
    find_library: Callable[[], str | None],
) -> ReexecPlan:
    """Decide whether to re-exec with an OpenBLAS preloaded. The two probes are called only
    when the cheap checks pass, so opted-out and already re-executed runs skip them."""
    if not platform.startswith("linux"):
        return ReexecPlan(None, f"not Linux ({platform})")
    if env.get(NO_REEXEC_ENV, "").strip().lower() in _TRUTHY:
        return ReexecPlan(None, f"{NO_REEXEC_ENV} is set")
    if env.get(MARKER_ENV):
        return ReexecPlan(None, "already re-executed once")
    if not is_cli_process:
        # Only the toolflash process itself may be replaced, never a host such as pytest
        # that calls cli.main() in-process.
        return ReexecPlan(None, "not running as the toolflash command")
    if not mlx_cpu_build():
        return ReexecPlan(None, "MLX is not the CPU build")
    preload = env.get("LD_PRELOAD", "")
    if "openblas" in preload or "libmkl" in preload:
        return ReexecPlan(None, "an optimized BLAS is already preloaded")
    openblas = find_library()
    if openblas is None:
        return ReexecPlan(None, "no OpenBLAS found (apt-get install libopenblas0-pthread)")
    return ReexecPlan(openblas, "preloading OpenBLAS for MLX's CPU matmuls")


def parse_ldconfig(output: str) -> list[str]:
    """Paths of libopenblas*.so.0 in `ldconfig -p` output, pthread builds first."""
    paths = []
    for line in output.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libopenblas") and ".so.0" in name and path:
            paths.append(path.strip())
    return sorted(paths, key=lambda p: ("pthread" not in p, p))


def find_openblas(
    candidates: Iterable[str] = KNOWN_OPENBLAS_PATHS,
    exists: Callable[[str], bool] = os.path.exists,
    ldconfig: Callable[[], str] | None = None,
) -> str | None:
    """The first known OpenBLAS path that exists, else the first one `ldconfig -p` lists."""
    for path in candidates:
        if exists(path):
            return path
    output = (ldconfig or _ldconfig_output)()
    found = [p for p in parse_ldconfig(output) if exists(p)]
    return found[0] if found else None


def _ldconfig_output() -> str:
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            return subprocess.run(
                [exe, "-p"], capture_output=True, text=True, timeout=5, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
    return ""


def mlx_is_cpu_build() -> bool:
    """True for the `mlx[cpu]` wheel (no Metal, no CUDA backend)."""
    installed = set()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("mlx-"):
            installed.add(name)
    if "mlx-cpu" in installed:
        return not any(n.startswith("mlx-cuda") or n == "mlx-metal" for n in installed)
    if sys.platform != "linux":
        return False
    try:
        import mlx.core as mx
    except ImportError:
        return False
    return not (mx.metal.is_available() or mx.cuda.is_available())


def _is_cli_process() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == "toolflash.cli":
        return True
    return Path(sys.argv[0]).name == "toolflash" if sys.argv else False


def ensure_optimized_blas(argv: list[str]) -> None:
    """Re-execute `python -m toolflash.cli *argv` with OpenBLAS preloaded when that helps.
    Returns normally when no re-exec is needed or possible."""
    _reexec([sys.executable, "-m", "toolflash.cli", *argv], _is_cli_process())


def ensure_optimized_blas_for_script() -> None:
    """The same for a script run as `python SCRIPT ...` (the benchmarks): re-execute it with
    OpenBLAS preloaded. Call it from the script's `__main__` guard only: it replaces the
    process (an importer, such as a test, never reaches it)."""
    _reexec([sys.executable, *sys.argv], True)


def _reexec(command: list[str], replaceable: bool) -> None:
    if not sys.platform.startswith("linux"):
        return
    env = os.environ
    plan = plan_blas_reexec(sys.platform, env, replaceable, mlx_is_cpu_build, find_openblas)
    if plan.library is None:
        return
    child_env = dict(env)
    preload = env.get("LD_PRELOAD", "")
    child_env["LD_PRELOAD"] = plan.library + (f":{preload}" if preload else "")
    child_env[MARKER_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, command, child_env)
    except OSError as exc:  # keep running on the reference BLAS rather than fail
        print(f"toolflash: could not re-exec with {plan.library}: {exc}", file=sys.stderr)


@dataclass(frozen=True)
class BlasInfo:
    """The BLAS that serves MLX's CPU matmuls in this process."""

    name: str  # openblas, mkl, blis, accelerate, reference, unknown
    path: str | None


def classify_blas(path: str) -> str:
    """A BLAS kind from a library path (symlinks resolved: Debian's libblas.so.3 may be
    an alternative pointing into openblas-pthread/)."""
    real = os.path.realpath(path)
    low = real.lower()
    for key, name in (
        ("openblas", "openblas"),
        ("mkl", "mkl"),
        ("blis", "blis"),
        ("accelerate", "accelerate"),
        ("vecLib".lower(), "accelerate"),
    ):
        if key in low:
            return name
    if Path(real).name.startswith("libblas") or Path(real).name.startswith("libcblas"):
        return "reference"
    return "unknown"


def _global_symbol_library(symbol: str) -> str | None:
    """Library that provides `symbol` in the process's global scope (where LD_PRELOAD'ed
    libraries sit and win over MLX's own dependencies), via dladdr."""

    class DlInfo(ctypes.Structure):
        _fields_ = [
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        ]

    try:
        proc = ctypes.CDLL(None)
        func = getattr(proc, symbol)
        info = DlInfo()
        if proc.dladdr(ctypes.cast(func, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.fsdecode(info.dli_fname)
    except (AttributeError, OSError):
        return None
    return None


def mapped_blas_libraries(maps: str | None = None) -> list[str]:
    """BLAS-looking shared libraries mapped in this process (from /proc/self/maps), excluding
    numpy/scipy's private symbol-prefixed OpenBLAS copies, which MLX never calls."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    seen: list[str] = []
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        name = Path(path).name.lower()
        if not path.startswith("/") or "scipy_openblas" in name:
            continue
        if any(k in name for k in ("blas", "mkl_rt", "blis")) and path not in seen:
            seen.append(path)
    return seen


def blas_info() -> BlasInfo:
    """Which BLAS MLX's CPU matmuls use in this process (imports mlx.core)."""
    import mlx.core  # noqa: F401  (loads libmlx and its BLAS so they are mapped)

    if sys.platform == "darwin":
        return BlasInfo("accelerate", None)
    provider = _global_symbol_library("cblas_sgemm")
    if provider is not None:
        return BlasInfo(classify_blas(provider), provider)
    # Not in the global scope: libmlx resolves its own dependency, the wheel's bundled BLAS.
    mapped = mapped_blas_libraries()
    bundled = [p for p in mapped if "mlx" in p]
    chosen = bundled[0] if bundled else (mapped[0] if mapped else None)
    return BlasInfo(classify_blas(chosen) if chosen else "unknown", chosen)


def blas_in_use() -> str:
    """Name of the BLAS MLX uses: openblas, mkl, blis, accelerate, reference or unknown."""
    return blas_info().name


def measure_matmul_gflops(n: int = 1024, dtype: str = "float32", min_time_s: float = 0.25) -> float:
    """Measured GFLOP/s of an n x n matmul on MLX's default device (2n^3 flops each),
    repeated until `min_time_s` has passed (at least once, after one warm-up)."""
    import mlx.core as mx

    dt = getattr(mx, dtype)
    a = mx.random.normal((n, n)).astype(dt)
    b = mx.random.normal((n, n)).astype(dt)
    mx.eval(a, b)
    mx.eval(a @ b)
    reps = 0
    start = time.perf_counter()
    while True:
        mx.eval(a @ b)
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time_s:
            break
    return 2.0 * n**3 * reps / elapsed / 1e9
