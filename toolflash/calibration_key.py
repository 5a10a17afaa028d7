"""What a calibration is valid for: the pair's weights, the machine and the software versions."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path

from toolflash.policy.calibration import CalibrationKey


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_identity() -> dict[str, str]:
    """What makes timings differ between machines: OS, CPU, MLX device and BLAS."""
    import mlx.core as mx

    from toolflash.blas import blas_in_use
    from toolflash.engine.targets.pipeline_ring import ring_layout

    info = {
        "system": platform.system(),
        "arch": platform.machine(),
        "cpu": _cpu_name(),
        "cores": str(os.cpu_count()),
        "device": str(mx.default_device()),
        "blas": blas_in_use(),
    }
    try:
        name = mx.device_info().get("device_name")
    except Exception:  # not every backend reports one
        name = None
    if name:
        info["device_name"] = str(name)
    layout = ring_layout()
    if layout is not None:  # rank 0 of a pipeline target: every forward crosses the ranks
        info["pipeline"] = layout
    return info


def weight_dir(model_id: str) -> Path | None:
    """The local directory of a served id: an embedded model (the draft id of an embedded
    pair is `<model>-dflash`), a local path, or a hub id's cached snapshot; None if unknown."""
    from toolflash.engine.factory import assets_dir
    from toolflash.engine.registry import EMBEDDED_PAIRS

    if model_id in EMBEDDED_PAIRS:
        return assets_dir() / EMBEDDED_PAIRS[model_id][0]
    embedded = model_id.removesuffix("-dflash")
    if model_id.endswith("-dflash") and embedded in EMBEDDED_PAIRS:
        return assets_dir() / EMBEDDED_PAIRS[embedded][1]
    local = Path(model_id).expanduser()
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # not cached, or not a hub id: the id alone identifies it
        return None


def weights_fingerprint(*ids: str | None) -> str:
    """A hash of the weight and config files (name, size, mtime) behind the served ids."""
    h = hashlib.sha256()
    for model_id in ids:
        h.update(f"{model_id}\0".encode())
        path = weight_dir(model_id) if model_id else None
        if path is None:
            continue
        for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("config.json")):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def calibration_key(model_id: str, draft_id: str | None) -> CalibrationKey:
    """The key a calibration of this pair made here and now would have."""
    return CalibrationKey(
        model=model_id,
        draft=draft_id,
        weights=weights_fingerprint(model_id, draft_id),
        machine=machine_identity(),
        mlx=_version("mlx"),
        mlx_lm=_version("mlx-lm"),
        toolflash=_version("toolflash"),
    )
