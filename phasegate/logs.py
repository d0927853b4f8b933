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

import orjson
import structlog

from phasegate.redact import redact_exc_info

# Loggers whose DEBUG/INFO lines may carry credentials (AWS signatures and session tokens, the
# Kubernetes client's bearer token), message bodies or one line per HTTP request (httpx, used
# by the CLI's --api): never below WARNING.
QUIET_LOGGERS = ("botocore", "aiobotocore", "boto3", "s3transfer", "urllib3", "httpx",
                 "httpcore", "kubernetes")
_HANDLER_MARK = "_phasegate_handler"
# The processor list of the JSON pipeline configure_logging set up last, and what it held then
# (None: console, or not configured by phasegate): a logger made while it still holds that may
# write its lines itself (lean_logger).
_json_pipeline: tuple[list[Any], list[Any]] | None = None


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
    processors = shared + tail
    global _json_pipeline
    _json_pipeline = None if use_console else (processors, list(processors))
    structlog.configure(
        processors=processors,
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


# What orjson writes natively but JSONRenderer() wrote through its fallback (a dataclass, a
# datetime): the fallback still decides, so a line keeps the values it had
# (``__structlog__()``, else ``repr``). Keys other than strings are written as strings, as
# the standard library does. (An enum or a UUID is written as its value, not its repr.)
_ORJSON_OPTIONS = (orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
                   | orjson.OPT_NON_STR_KEYS)
# The standard library's encoder, built once (json.dumps with ``default=`` builds one per
# call), for the lines orjson refuses: an integer beyond 64 bits, a nesting too deep.
_STDLIB_ENCODE = json.JSONEncoder(default=_json_fallback).encode


def _encode(event_dict: Any) -> str:
    """One log line's JSON: compact, UTF-8 as it is, NaN and infinities as null (JSON has no
    spelling for them). orjson writes it in a fifth of the standard library's time; with two
    lines a phase, the standard library's encoding was 7 % of a worker's CPU per phase at 16
    groups (docs/benchmarks-rounds.md)."""
    try:
        return orjson.dumps(event_dict, default=_json_fallback,
                            option=_ORJSON_OPTIONS).decode()
    except (orjson.JSONEncodeError, TypeError):
        return _STDLIB_ENCODE(event_dict)


_ENCODE = _encode


def render_json(logger: Any, method_name: str, event_dict: Any) -> str:
    """The JSON renderer: the keys and values ``structlog.processors.JSONRenderer()`` wrote,
    encoded by orjson (``_encode``)."""
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


class bound_contextvars:
    """``structlog.contextvars.bound_contextvars`` for the keys a worker binds per message:
    the keys bound on entry, each put back on exit as it was (by the tokens of the set), where
    structlog's reads every context variable of the process on entry to save what it
    replaces and sets each key twice on exit."""

    __slots__ = ("_kw", "_tokens")

    def __init__(self, **kw: Any) -> None:
        self._kw = kw
        self._tokens: Any = None

    def __enter__(self) -> None:
        self._tokens = structlog.contextvars.bind_contextvars(**self._kw)

    def __exit__(self, *exc: object) -> None:
        structlog.contextvars.reset_contextvars(**self._tokens)


def lean_logger(logger: Any) -> Any:
    """``logger`` bound once (the configuration in force now, as structlog's ``bind()``), for a
    line written on every phase (the phase line, the checkpoint's audit line).

    Under phasegate's own JSON pipeline (``configure_logging``) its ``info`` writes the line
    itself: the same keys and values, one write and flush under structlog's lock for the file,
    in about two thirds of the processor chain's time (whose context-variable merge walks every
    context variable of the process; ``python -m bench.hops``). Under any other configuration (the
    console renderer, an embedding application's own) it is structlog's bound logger,
    unchanged; a chain changed in place later (a test's ``capture_logs``) is followed."""
    bound = logger.bind()
    processors = getattr(bound, "_processors", None)
    writer = getattr(bound, "_logger", None)
    pipeline = _json_pipeline
    if (pipeline is None or processors is not pipeline[0] or processors != pipeline[1]
            or not isinstance(writer, structlog.WriteLogger)):
        return bound
    return LeanJsonLogger(bound, writer, *pipeline)


class LeanJsonLogger:
    """``info`` lines of phasegate's JSON pipeline written without the processor chain: the
    bound context, the call's keys, ``event``, the structlog context variables bound now (as
    ``merge_contextvars``: never over a key the call gave), ``level``, ``timestamp``. A call
    with ``exc_info`` (or any level but info) goes through structlog's chain, and so does every
    call once the chain's list no longer holds what it held (``capture_logs`` changes it in
    place, and a bound logger follows it)."""

    def __init__(self, bound: Any, writer: Any, processors: list[Any],
                 configured: list[Any]) -> None:
        self._bound = bound
        self._processors = processors
        self._configured = configured
        self._context = dict(getattr(bound, "_context", None) or {})
        self._write = writer.msg
        self._enabled = bool(bound.is_enabled_for(logging.INFO))
        stamps = [p for p in configured if isinstance(p, IsoUtcTimestamp)]
        self._stamp = stamps[0] if stamps else IsoUtcTimestamp()

    def __getattr__(self, name: str) -> Any:  # warning, error, bind, ...: structlog's own
        return getattr(self._bound, name)

    def info(self, event: str, **kw: Any) -> None:
        if not self._enabled:
            return
        if "exc_info" in kw or self._processors != self._configured:
            self._bound.info(event, **kw)
            return
        line = {**self._context, **kw} if self._context else kw
        line["event"] = event
        for name, value in _bound_contextvars():
            line.setdefault(name, value)
        line["level"] = "info"
        self._stamp(None, "info", line)
        self._write(_ENCODE(line))


_PREFIX_LENGTH = len(structlog.contextvars.STRUCTLOG_KEY_PREFIX)
# structlog's registry of the context variables it made (one per key ever bound, so it stays
# small): reading each is cheaper than walking every context variable of the process.
_CONTEXT_VARS: dict[str, Any] | None = getattr(structlog.contextvars, "_CONTEXT_VARS", None)


def _bound_contextvars() -> list[tuple[str, Any]]:
    """structlog's context variables bound in this context, by name without the prefix: each
    variable of structlog's registry read, where ``merge_contextvars`` walks every context
    variable of the process."""
    if _CONTEXT_VARS is not None:
        try:
            # Copied in one C call; should another thread bind a new key meanwhile (the copy
            # then raises), the context is walked as structlog does.
            registered = tuple(_CONTEXT_VARS.values())
        except RuntimeError:
            registered = None
        if registered is not None:
            bound = []
            for var in registered:
                value = var.get(Ellipsis)
                if value is not Ellipsis:
                    bound.append((var.name[_PREFIX_LENGTH:], value))
            return bound
    return list(structlog.contextvars.get_contextvars().items())
