"""Resolve a model argument (local directory or Hugging Face hub id) to a local directory.

A local directory is used as is. A hub id is looked up in the local cache and, unless
`HF_HUB_OFFLINE` is set, on the hub, downloading only what loading needs (config, safetensors,
tokenizer and chat-template files). Network calls are bounded by a timeout so that an
unreachable hub gives a clear error instead of a hang.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from toolflash.engine.api import EngineError

log = structlog.get_logger(__name__)

# What mlx-lm and the drafter loader read; everything else in a repo (PyTorch .bin, .gguf,
# images) is skipped.
ALLOW_PATTERNS: tuple[str, ...] = (
    "*.json",
    "*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
)

_TRUTHY = {"1", "on", "yes", "true"}


class ModelNotFoundError(EngineError):
    """The model is neither a local directory nor available from the Hugging Face cache/hub."""


def hub_offline() -> bool:
    """Whether `HF_HUB_OFFLINE` is set (read at call time, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUTHY


def hub_timeout_s() -> float:
    """Seconds allowed for one hub metadata request (`HF_HUB_ETAG_TIMEOUT`, default 10)."""
    raw = os.environ.get("HF_HUB_ETAG_TIMEOUT") or os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT")
    try:
        return float(raw) if raw else 10.0
    except ValueError:
        return 10.0


def _cache_dir() -> str | None:
    """The hub cache honouring `HF_HUB_CACHE` / `HF_HOME` at call time (None: library default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _looks_like_path(id_or_path: str) -> bool:
    return id_or_path.startswith(("/", "./", "../", "~")) or id_or_path in {".", ".."}


def resolve_model_path(id_or_path: str) -> Path:
    """A local directory for `id_or_path`: the directory itself, or the cached/downloaded
    snapshot of a hub repo. Raises ModelNotFoundError with the reason and how to fix it."""
    local = Path(id_or_path).expanduser()
    if local.is_dir():
        return local
    if local.exists():
        raise ModelNotFoundError(f"model path '{id_or_path}' exists but is not a directory")
    if _looks_like_path(id_or_path) or id_or_path.count("/") > 1 or not id_or_path.strip():
        raise ModelNotFoundError(
            f"model '{id_or_path}' is not a local directory (no such path) and not a hub id "
            "of the form 'org/name'"
        )
    return _resolve_hub_id(id_or_path)


def _resolve_hub_id(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    cache_dir = _cache_dir()
    timeout = hub_timeout_s()
    where = cache_dir or "the default Hugging Face cache"
    offline = hub_offline()
    try:
        cached = snapshot_download(
            repo_id,
            allow_patterns=list(ALLOW_PATTERNS),
            cache_dir=cache_dir,
            local_files_only=True,
        )
    except HFValidationError as exc:
        raise ModelNotFoundError(
            f"model '{repo_id}' is neither a local directory nor a valid hub id: {exc}"
        ) from exc
    except LocalEntryNotFoundError:
        cached = None
    if cached is not None and _looks_complete(Path(cached)):
        return Path(cached)
    if cached is not None and offline:
        raise ModelNotFoundError(
            f"model '{repo_id}' is cached in {where} but incompletely (no config.json or no "
            "*.safetensors) and HF_HUB_OFFLINE is set: unset HF_HUB_OFFLINE to finish the download"
        )
    if offline:
        raise ModelNotFoundError(
            f"model '{repo_id}' is neither a local directory nor cached in {where}, and "
            "HF_HUB_OFFLINE is set. Download it where the hub is reachable "
            f"(`hf download {repo_id}`), point HF_HUB_CACHE at a cache that holds it, pass a "
            "local directory, or unset HF_HUB_OFFLINE."
        )
    commit = _probe_hub(repo_id, timeout)
    try:
        path = snapshot_download(
            repo_id,
            revision=commit,
            allow_patterns=list(ALLOW_PATTERNS),
            cache_dir=cache_dir,
            etag_timeout=timeout,
        )
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ModelNotFoundError(_not_on_hub(repo_id, exc)) from exc
    except (LocalEntryNotFoundError, OSError) as exc:
        raise ModelNotFoundError(_unreachable(repo_id, where, exc)) from exc
    log.info("model_downloaded", repo_id=repo_id, path=str(path))
    return Path(path)


def _looks_complete(snapshot: Path) -> bool:
    """A cached snapshot without a tree listing cannot be checked file by file; require at
    least the files every model needs (a partial `hf download X config.json` has no weights)."""
    return (snapshot / "config.json").is_file() and any(snapshot.glob("*.safetensors"))


def _probe_hub(repo_id: str, timeout: float) -> str:
    """The repo's current commit, from one metadata request bounded by `timeout`
    (`snapshot_download` itself would make this request without a timeout)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        info = HfApi().repo_info(repo_id, timeout=timeout)
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ModelNotFoundError(_not_on_hub(repo_id, exc)) from exc
    except Exception as exc:  # connection refused, DNS, timeout, proxy, 5xx: all "unreachable"
        raise ModelNotFoundError(_unreachable(repo_id, _cache_dir() or "", exc)) from exc
    if not info.sha:
        raise ModelNotFoundError(f"the hub returned no revision for '{repo_id}'")
    return info.sha


def _not_on_hub(repo_id: str, exc: Exception) -> str:
    return (
        f"model '{repo_id}' is not a local directory and the hub has no accessible repo of "
        f"that name ({type(exc).__name__}). Check the spelling; for a gated or private repo "
        "log in (`hf auth login`) or set HF_TOKEN."
    )


def _unreachable(repo_id: str, where: str, exc: Exception) -> str:
    return (
        f"model '{repo_id}' is neither a local directory nor cached in "
        f"{where or 'the default Hugging Face cache'}, and the hub could not be reached "
        f"({type(exc).__name__}: {exc}). Check the network (or HF_ENDPOINT / proxy settings), "
        "download it elsewhere with `hf download` and copy the cache, or pass a local directory."
    )
