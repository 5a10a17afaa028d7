"""The session state types now live with the prefix cache that stores them (`cache/state.py`); this
module re-exports them for the engine modules that still import them from here."""

from toolflash.cache.state import (
    DraftState,
    LayerKind,
    LayerState,
    SessionState,
    export_cache,
    restore_cache,
)

__all__ = [
    "DraftState",
    "LayerKind",
    "LayerState",
    "SessionState",
    "export_cache",
    "restore_cache",
]
