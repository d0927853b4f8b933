from __future__ import annotations

import pytest

from phasegate.settings import SettingsError, load_settings


def test_defaults_are_sane(monkeypatch):
    for key in list(__import__("os").environ):
        if key.startswith("PHASEGATE_"):
            monkeypatch.delenv(key)
    settings = load_settings()
    assert settings.visibility_timeout_s == 30 and settings.heartbeat_s == 10
    assert settings.concurrency == 4 and settings.faults == ""
    assert settings.continuation and settings.leased_send


def test_env_vars_are_read(monkeypatch):
    monkeypatch.setenv("PHASEGATE_CONCURRENCY", "7")
    monkeypatch.setenv("PHASEGATE_WORKFLOW_MODULES", "a.b, c.d ,")
    settings = load_settings()
    assert settings.concurrency == 7 and settings.module_list == ["a.b", "c.d"]


@pytest.mark.parametrize(("key", "value"), [
    ("PHASEGATE_WAIT_TIME_S", "21"),
    ("PHASEGATE_QUEUE_URL", "sqs://nope"),
    ("PHASEGATE_MAX_MESSAGE_BYTES", "999999999"),
    # A lease holder is the worker id or the id + "/sent" (a leased send's): a "/" in the id
    # would blur the two.
    ("PHASEGATE_WORKER_ID", "pod-1/sent"),
    ("PHASEGATE_WORKER_ID", ""),
])
def test_invalid_values_name_the_variable(monkeypatch, key, value):
    monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert info.value.variable == key


def test_require_names_the_missing_variable(monkeypatch):
    monkeypatch.delenv("PHASEGATE_QUEUE_URL", raising=False)
    with pytest.raises(SettingsError, match="PHASEGATE_QUEUE_URL"):
        load_settings().require("queue_url")
