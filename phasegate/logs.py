"""structlog configuration: JSON when not on a TTY, the workflow id bound per message.

Libraries that log through the standard library (uvicorn, asyncpg, botocore, aiobotocore,
moto's werkzeug) go through the same processors and renderer via a handler on the root
logger, so a log shipper sees one JSON object per line with the same keys (``event``,
``level``, ``timestamp``, plus ``logger``) whichever code wrote it. The AWS SDK loggers are
held at WARNING or above whatever ``PHASEGATE_LOG_LEVEL`` says: their DEBUG output carries
request headers (signatures, session tokens) and bodies (workflow input).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from phasegate.redact import redact_exc_info

# Loggers whose DEBUG/INFO lines may carry credentials (AWS signatures and session tokens, the
# Kubernetes client's bearer token), message bodies or one line per HTTP request (httpx, used
# by the CLI's --api): never below WARNING.
QUIET_LOGGERS = ("botocore", "aiobotocore", "boto3", "s3transfer", "urllib3", "httpx",
                 "httpcore", "kubernetes")
_HANDLER_MARK = "_phasegate_handler"


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: Any = (structlog.dev.ConsoleRenderer(colors=False) if use_console
                     else structlog.processors.JSONRenderer())
    threshold = getattr(logging, level.upper(), logging.INFO)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        # Before any renderer: exceptions as type + fingerprint + frames, never their
        # message or locals (which may hold workflow state; phasegate/redact.py).
        redact_exc_info,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    tail: list[Any] = [structlog.processors.dict_tracebacks if not use_console
                       else structlog.dev.set_exc_info, renderer]
    structlog.configure(
        processors=shared + tail,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _route_stdlib(threshold, structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail]))


def _route_stdlib(threshold: int, formatter: logging.Formatter) -> None:
    """One handler on the root logger (replacing ours from an earlier call, leaving any other
    handler alone), writing to the same stream as structlog."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
    handler = _StderrHandler()
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(threshold)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(threshold, logging.WARNING))
    # uvicorn configures its loggers only from its own log_config (the orchestrator passes
    # None): make sure they reach the root handler rather than a handler of their own.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncpg"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def reset_logging() -> None:
    """Undo ``configure_logging`` for the standard library (tests; an embedding application)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record arrives, so a process (or a test)
    that swaps stderr later never has records written to a closed stream."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stderr)
        super().emit(record)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
