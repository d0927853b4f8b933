"""structlog configuration: JSON when not on a TTY, the workflow id bound per message."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from phasegate.redact import redact_exc_info


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: Any = (structlog.dev.ConsoleRenderer(colors=False) if use_console
                     else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            # Before any renderer: exceptions as type + fingerprint + frames, never their
            # message or locals (which may hold workflow state; phasegate/redact.py).
            redact_exc_info,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks if not use_console
            else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
