"""structlog setup for the server: one JSON object per line on stderr (or console lines)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, json_lines: bool = True, level: str = "info") -> None:
    """Configure structlog process-wide (called by `toolflash serve`, never at import)."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
