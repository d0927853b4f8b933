"""structlog configuration: JSON when not on a TTY, the workflow id bound per message.

Libraries that log through the standard library (uvicorn, asyncpg, botocore, aiobotocore,
moto's werkzeug) go through the same processors and renderer via a handler on the root
logger, so a log shipper sees one JSON object per line with the same keys (``event``,
``level``, ``timestamp``, plus ``logger``) whichever code wrote it. The AWS SDK loggers are
held at WARNING or above whatever ``PHASEGATE_LOG_LEVEL`` says: their DEBUG output carries
request headers (signatures, session tokens) and bodies (workflow input).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
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
                     else render_json)
    threshold = getattr(logging, level.upper(), logging.INFO)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        # Before any renderer: exceptions as type + fingerprint + frames, never their
        # message or locals (which may hold workflow state; phasegate/redact.py).
        redact_exc_info,
        IsoUtcTimestamp(),
    ]
    tail: list[Any] = [structlog.processors.dict_tracebacks if not use_console
                       else structlog.dev.set_exc_info, renderer]
    structlog.configure(
        processors=shared + tail,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        # One write and one flush per line (print writes the line and its newline apart).
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _route_stdlib(threshold, structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail]))


class IsoUtcTimestamp:
    """``timestamp``: what ``structlog.processors.TimeStamper(fmt="iso", utc=True)`` writes
    (``2026-12-03T07:53:01.123456Z``, no fraction on a whole second), with the date and time
    of day formatted once per second rather than on every line: a worker writes two lines per
    phase, and building and formatting a datetime was a fifth of a line's cost."""

    def __init__(self) -> None:
        # One tuple, replaced whole: a thread writing a line meanwhile reads a matching pair.
        self._second: tuple[int, str] = (-1, "")

    def __call__(self, logger: Any, method_name: str, event_dict: Any) -> Any:
        second, micros = divmod(time.time_ns() // 1000, 1_000_000)
        cached, prefix = self._second
        if second != cached:
            prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            self._second = (second, prefix)
        event_dict["timestamp"] = f"{prefix}.{micros:06d}Z" if micros else f"{prefix}Z"
        return event_dict


def _json_fallback(value: Any) -> Any:
    """As structlog's JSONRenderer: an object's ``__structlog__()``, else its ``repr``."""
    try:
        return value.__structlog__()
    except AttributeError:
        return repr(value)


# json.dumps with ``default=`` builds a new encoder on every call; this one is built once
# (encoding keeps no state between calls) and writes what JSONRenderer() wrote.
_ENCODE = json.JSONEncoder(default=_json_fallback).encode


def render_json(logger: Any, method_name: str, event_dict: Any) -> str:
    """The JSON renderer: ``structlog.processors.JSONRenderer()``'s output, one encoder."""
    return _ENCODE(event_dict)


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
