"""Standard-library loggers (uvicorn, asyncpg, botocore, ...) go through the same structlog
JSON pipeline as phasegate's own lines (phasegate/logs.py)."""

from __future__ import annotations

import json
import logging
import math

import pytest
import structlog

from phasegate.logs import bound_contextvars, configure_logging, reset_logging

SECRET = "AKIAEXAMPLESECRET/wJalrXUtnFEMI"


class Stderr:
    """What the process wrote to stderr (pytest's capture), read as text and as JSON lines."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.text = ""

    def getvalue(self) -> str:
        self.text += self.capsys.readouterr().err
        return self.text


@pytest.fixture
def stderr(capsys: pytest.CaptureFixture[str]):
    yield Stderr(capsys)
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()
    reset_logging()


def lines(buffer: Stderr) -> list[dict[str, object]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_a_stdlib_record_is_one_json_line_with_the_same_keys(stderr: Stderr) -> None:
    configure_logging("info", "json")
    structlog.contextvars.bind_contextvars(workflow_id="wf_1")
    structlog.get_logger("phasegate.test").info("own_line", n=1)
    logging.getLogger("uvicorn.error").info("Uvicorn running on %s", "http://127.0.0.1:8080")
    logging.getLogger("asyncpg.pool").warning("pool %s closing", "p1")
    own, uvicorn, asyncpg = lines(stderr)  # one line per record, each valid JSON
    assert own["event"] == "own_line" and own["workflow_id"] == "wf_1"
    assert uvicorn["event"] == "Uvicorn running on http://127.0.0.1:8080"
    assert uvicorn["logger"] == "uvicorn.error" and asyncpg["logger"] == "asyncpg.pool"
    for record in (uvicorn, asyncpg):
        assert set(own) - {"n"} <= set(record)  # event, level, timestamp, bound context
        assert record["workflow_id"] == "wf_1"
    assert [uvicorn["level"], asyncpg["level"]] == ["info", "warning"]
    assert str(uvicorn["timestamp"]).endswith("Z")


def test_aws_sdk_debug_lines_never_reach_the_log_even_at_debug(stderr: Stderr) -> None:
    configure_logging("debug", "json")
    for name in ("botocore.endpoint", "aiobotocore.endpoint", "botocore.auth"):
        logging.getLogger(name).debug("Sending http request: Authorization=%s", SECRET)
    logging.getLogger("botocore.credentials").info("Found credentials %s", SECRET)
    logging.getLogger("botocore.retryhandler").warning("retry needed: throttled")
    logging.getLogger("uvicorn.error").debug("debug from uvicorn")
    assert SECRET not in stderr.getvalue()
    events = [record["event"] for record in lines(stderr)]
    assert events == ["retry needed: throttled", "debug from uvicorn"]


def test_a_stdlib_exception_is_redacted_like_our_own(stderr: Stderr) -> None:
    configure_logging("info", "json")
    try:
        raise ValueError(f"state held {SECRET}")
    except ValueError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    (record,) = lines(stderr)
    assert SECRET not in stderr.getvalue()
    assert record["error_type"] == "ValueError"
    assert str(record["error"]).startswith("ValueError (message withheld")
    assert record["traceback"] and record["event"] == "Exception in ASGI application"


def test_configuring_twice_keeps_one_handler_and_reset_removes_it(stderr: Stderr) -> None:
    before = list(logging.getLogger().handlers)
    configure_logging("info", "json")
    configure_logging("warning", "json")
    logging.getLogger("asyncpg").info("dropped below the level")
    logging.getLogger("asyncpg").error("kept")
    assert [r["event"] for r in lines(stderr)] == ["kept"]
    reset_logging()
    assert logging.getLogger().handlers == before


def test_the_timestamp_is_what_structlog_s_iso_utc_stamper_writes(monkeypatch) -> None:
    from datetime import UTC, datetime

    from phasegate import logs

    stamp = logs.IsoUtcTimestamp()
    # Within a second, across a second, a whole second (no fraction, as isoformat writes it).
    for ns in (1_764_745_981_123_456_789, 1_764_745_981_999_999_999, 1_764_745_982_000_000_000,
               1_764_745_982_000_001_000, 1_764_745_981_500_000_000):
        monkeypatch.setattr(logs.time, "time_ns", lambda ns=ns: ns)
        second, micros = divmod(ns // 1000, 1_000_000)
        expected = (datetime.fromtimestamp(second, UTC).replace(microsecond=micros)
                    .isoformat().replace("+00:00", "Z"))
        assert stamp(None, "info", {})["timestamp"] == expected


def test_the_json_renderer_writes_the_keys_and_values_structlog_s_wrote() -> None:
    from datetime import UTC, datetime

    from phasegate.logs import render_json

    class Custom:
        def __structlog__(self) -> str:
            return "custom!"

    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    event = {"event": "phase", "n": 1, "f": 0.5, "nan": float("nan"), "none": None,
             "nested": {"a": [1, "é"]}, "custom": Custom(), "opaque": Opaque(),
             "when": datetime(2026, 12, 3, tzinfo=UTC), "set": {3}}
    stock = json.loads(structlog.processors.JSONRenderer()(None, "info", dict(event)))
    written = render_json(None, "info", dict(event))
    # Compact, UTF-8 as it is, and NaN as null: JSON has no NaN (structlog wrote one).
    assert written.startswith('{"event":"phase","n":1,')
    assert '"é"' in written and '"nan":null' in written
    assert math.isnan(stock.pop("nan")) and json.loads(written) == {**stock, "nan": None}
    # What orjson cannot write goes through the standard library's encoder, not lost.
    assert json.loads(render_json(None, "info", {"big": 2**70})) == {"big": 2**70}


def test_a_lean_line_has_the_keys_and_values_of_the_processor_chain_s(stderr: Stderr) -> None:
    from phasegate.logs import LeanJsonLogger, lean_logger

    configure_logging("info", "json")
    chain = structlog.get_logger("phasegate.test").bind(store="eu")
    lean = lean_logger(chain)
    assert isinstance(lean, LeanJsonLogger)
    # Bound context variables, one the call overrides (the call's key wins, as in
    # merge_contextvars), one unset again (not written), and values JSON writes as repr.
    structlog.contextvars.bind_contextvars(workflow_id="wf_1", seq=3, phase="bound")
    with structlog.contextvars.bound_contextvars(gone=1):
        pass
    for logger in (chain, lean):
        logger.info("phase", phase="p1", outcome="advanced", duration_s=0.000123,
                    odd={1}, note="é")
    by_chain, by_lean = lines(stderr)
    assert by_chain.pop("timestamp") and str(by_lean.pop("timestamp")).endswith("Z")
    assert by_lean == by_chain
    assert by_lean["phase"] == "p1" and by_lean["store"] == "eu" and "gone" not in by_lean
    assert by_lean["odd"] == "{1}" and by_lean["level"] == "info"


def test_a_lean_logger_below_its_level_or_with_an_exception_behaves_as_structlog(
        stderr: Stderr) -> None:
    from phasegate.logs import lean_logger

    configure_logging("warning", "json")
    quiet = lean_logger(structlog.get_logger("phasegate.test"))
    quiet.info("dropped")
    quiet.warning("kept", n=1)  # every other method is structlog's
    configure_logging("info", "json")
    loud = lean_logger(structlog.get_logger("phasegate.test"))
    try:
        raise ValueError(f"state held {SECRET}")
    except ValueError:
        loud.info("failed", exc_info=True)  # redacted by the chain, as any line
    kept, failed = lines(stderr)
    assert kept["event"] == "kept" and kept["level"] == "warning"
    assert failed["error_type"] == "ValueError" and SECRET not in stderr.getvalue()


def test_a_lean_logger_outside_phasegate_s_json_pipeline_is_structlog_s(
        stderr: Stderr) -> None:
    from structlog.testing import capture_logs

    from phasegate.logs import LeanJsonLogger, lean_logger

    configure_logging("info", "console")
    assert not isinstance(lean_logger(structlog.get_logger("x")), LeanJsonLogger)
    configure_logging("info", "json")
    with capture_logs() as captured:  # a test's (or an application's) own configuration
        logger = lean_logger(structlog.get_logger("x"))
        logger.info("phase", phase="p1")
    assert not isinstance(logger, LeanJsonLogger)
    assert captured == [{"event": "phase", "phase": "p1", "log_level": "info"}]
    # Made under phasegate's pipeline, before a capture started (as a worker's phase line):
    # followed into the capture, as structlog's own bound loggers are.
    early = lean_logger(structlog.get_logger("x"))
    assert isinstance(early, LeanJsonLogger)
    with capture_logs() as captured:
        early.info("phase", phase="p2")
    assert captured == [{"event": "phase", "phase": "p2", "log_level": "info"}]
    assert stderr.getvalue() == ""


@pytest.mark.parametrize("registry", ["changing", "absent"])
def test_a_lean_line_without_structlog_s_registry_walks_the_context(
        stderr: Stderr, monkeypatch: pytest.MonkeyPatch, registry: str) -> None:
    """Another thread binding a new key while the registry is copied, or a structlog without
    the registry: the context variables come from walking the context, as structlog does."""
    from phasegate import logs

    class Changing(dict):  # type: ignore[type-arg]
        def values(self):  # type: ignore[override]
            raise RuntimeError("dictionary changed size during iteration")

    monkeypatch.setattr(logs, "_CONTEXT_VARS", Changing() if registry == "changing" else None)
    configure_logging("info", "json")
    structlog.contextvars.bind_contextvars(workflow_id="wf_2", seq=4)
    logs.lean_logger(structlog.get_logger("x")).info("phase", phase="p1")
    (line,) = lines(stderr)
    assert line["workflow_id"] == "wf_2" and line["seq"] == 4 and line["phase"] == "p1"


def test_a_message_s_bound_keys_are_put_back_as_they_were_on_exit(stderr: Stderr) -> None:
    configure_logging("info", "json")
    structlog.contextvars.bind_contextvars(request="outer", seq=1)
    with bound_contextvars(workflow_id="w-1", seq=7):
        # Rebound inside, as a chain does for each continued hop's seq.
        structlog.contextvars.bind_contextvars(seq=8)
        structlog.get_logger("t").info("inside")
    structlog.get_logger("t").info("after")
    inside, after = lines(stderr)
    assert (inside["workflow_id"], inside["seq"], inside["request"]) == ("w-1", 8, "outer")
    assert (after["seq"], after["request"]) == (1, "outer")
    assert "workflow_id" not in after
    assert structlog.contextvars.get_contextvars() == {"request": "outer", "seq": 1}


def test_a_message_s_bound_keys_are_put_back_when_its_handling_raises(stderr: Stderr) -> None:
    with pytest.raises(RuntimeError), bound_contextvars(workflow_id="w-2"):
        raise RuntimeError("phase failed")
    assert structlog.contextvars.get_contextvars() == {}
