"""OpenBLAS re-exec decision, library discovery and BLAS detection."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from toolflash import blas
from toolflash.blas import (
    MARKER_ENV,
    NO_REEXEC_ENV,
    classify_blas,
    ensure_optimized_blas,
    find_openblas,
    mapped_blas_libraries,
    measure_matmul_gflops,
    parse_ldconfig,
    plan_blas_reexec,
)

LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def _never() -> bool:
    raise AssertionError("probe must not run when a cheap check already decided")


@pytest.mark.parametrize(
    ("platform", "env", "is_cli", "cpu_build", "lib", "expect", "reason"),
    [
        ("linux", {}, True, True, LIB, LIB, "preloading"),
        ("linux", {"LD_PRELOAD": "/x/libfoo.so"}, True, True, LIB, LIB, "preloading"),
        ("darwin", {}, True, True, LIB, None, "not Linux"),
        ("linux", {NO_REEXEC_ENV: "1"}, True, True, LIB, None, NO_REEXEC_ENV),
        ("linux", {NO_REEXEC_ENV: "true"}, True, True, LIB, None, NO_REEXEC_ENV),
        ("linux", {NO_REEXEC_ENV: "0"}, True, True, LIB, LIB, "preloading"),
        ("linux", {MARKER_ENV: "1"}, True, True, LIB, None, "already re-executed"),
        ("linux", {}, False, True, LIB, None, "not running as the toolflash command"),
        ("linux", {}, True, False, LIB, None, "not the CPU build"),
        ("linux", {"LD_PRELOAD": LIB}, True, True, LIB, None, "already preloaded"),
        ("linux", {}, True, True, None, None, "libopenblas0-pthread"),
    ],
)
def test_reexec_decision(
    platform: str,
    env: dict[str, str],
    is_cli: bool,
    cpu_build: bool,
    lib: str | None,
    expect: str | None,
    reason: str,
) -> None:
    plan = plan_blas_reexec(platform, env, is_cli, lambda: cpu_build, lambda: lib)
    assert plan.library == expect
    assert reason in plan.reason


def test_probes_skipped_when_opted_out() -> None:
    plan = plan_blas_reexec("linux", {NO_REEXEC_ENV: "1"}, True, _never, lambda: None)
    assert plan.library is None


LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
	libopenblas.so.0 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libopenblas.so.0
	libopenblas.so.0 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
	libblas.so.3 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libblas.so.3
"""


def test_parse_ldconfig_prefers_pthread() -> None:
    assert parse_ldconfig(LDCONFIG) == [
        "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
        "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    ]


@pytest.mark.parametrize(
    ("present", "expect"),
    [
        ({"/known/b.so"}, "/known/b.so"),
        ({"/known/a.so", "/known/b.so"}, "/known/a.so"),
        (
            {"/usr/lib/x86_64-linux-gnu/libopenblas.so.0"},
            "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
        ),
        (set(), None),
    ],
)
def test_find_openblas(present: set[str], expect: str | None) -> None:
    found = find_openblas(
        candidates=("/known/a.so", "/known/b.so"),
        exists=present.__contains__,
        ldconfig=lambda: LDCONFIG,
    )
    assert found == expect


def test_classify_blas(tmp_path: Path) -> None:
    target = tmp_path / "openblas-pthread" / "libblas.so.3"
    target.parent.mkdir()
    target.write_bytes(b"")
    alt = tmp_path / "libblas.so.3"
    alt.symlink_to(target)  # Debian alternatives: libblas.so.3 -> openblas-pthread/
    assert classify_blas(str(alt)) == "openblas"
    assert classify_blas("/site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0") == "reference"
    assert classify_blas("/opt/intel/lib/libmkl_rt.so.2") == "mkl"
    assert classify_blas("/usr/lib/libfoo.so") == "unknown"


def test_mapped_blas_libraries_skips_numpy_copy() -> None:
    maps = "\n".join(
        [
            "7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6",
            "7f02-7f03 r-xp 0 08:01 2 /sp/numpy.libs/libscipy_openblas64_-32a4.so",
            "7f04-7f05 r-xp 0 08:01 3 /sp/mlx_cpu.libs/libblas-bd8a.so.3.10.0",
            "7f06-7f07 r--p 0 08:01 3 /sp/mlx_cpu.libs/libblas-bd8a.so.3.10.0",
            "7f08-7f09 rw-p 0 00:00 0 [heap]",
        ]
    )
    assert mapped_blas_libraries(maps) == ["/sp/mlx_cpu.libs/libblas-bd8a.so.3.10.0"]


def test_in_process_call_never_replaces_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest is not the toolflash command: even with every condition met, no exec happens.
    monkeypatch.delenv(NO_REEXEC_ENV, raising=False)
    monkeypatch.delenv(MARKER_ENV, raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(blas.os, "execve", _never)
    ensure_optimized_blas(["doctor"])


def test_matmul_gflops_is_measured() -> None:
    value = measure_matmul_gflops(n=128, min_time_s=0.02)
    assert math.isfinite(value) and value > 0.05


def _doctor_blas(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "toolflash.cli", "doctor", "--json", "--no-bench"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)["blas"]


@pytest.mark.skipif(not os.path.exists(LIB), reason=f"{LIB} not installed")
@pytest.mark.skipif(not blas.mlx_is_cpu_build(), reason="only the mlx[cpu] build is re-executed")
def test_cli_reexecs_with_openblas() -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in {"LD_PRELOAD", NO_REEXEC_ENV, MARKER_ENV}
    }
    info = _doctor_blas(env)
    assert info["name"] == "openblas"
    assert info["path"] == LIB
    opted_out = _doctor_blas({**env, NO_REEXEC_ENV: "1"})
    assert opted_out["name"] == "reference"


@pytest.mark.skipif(not os.path.exists(LIB), reason=f"{LIB} not installed")
@pytest.mark.skipif(not blas.mlx_is_cpu_build(), reason="only the mlx[cpu] build is re-executed")
def test_a_benchmark_script_reexecs_with_openblas_and_keeps_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "bench_like.py"
    script.write_text(
        "import json, sys\n"
        "from toolflash.blas import blas_in_use, ensure_optimized_blas_for_script\n"
        "if __name__ == '__main__':\n"
        "    ensure_optimized_blas_for_script()\n"
        "    print(json.dumps([blas_in_use(), sys.argv[1:]]))\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in {"LD_PRELOAD", NO_REEXEC_ENV, MARKER_ENV}
    }
    run = partial(subprocess.run, capture_output=True, text=True, timeout=120, check=True)
    out = run([sys.executable, str(script), "--x", "1"], env=env)
    assert json.loads(out.stdout) == ["openblas", ["--x", "1"]]
    out = run([sys.executable, str(script)], env={**env, NO_REEXEC_ENV: "1"})
    assert json.loads(out.stdout)[0] == "reference"
