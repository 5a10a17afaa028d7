"""What a benchmark script does before its work, as `python benchmarks/SCRIPT.py` runs it."""

from __future__ import annotations


def ensure_optimized_blas_for_script() -> None:
    """`toolflash.blas.ensure_optimized_blas_for_script` (re-execute with OpenBLAS preloaded
    where MLX is the CPU build) where the toolflash on the path has it: the rounds harnesses
    run this folder's scripts against packages of older commits."""
    try:
        from toolflash.blas import ensure_optimized_blas_for_script as ensure
    except ImportError:
        return
    ensure()
