"""``phasegate signal`` and the waiting run in ``phasegate inspect``, reading the database
directly (the API path is the same Control.signal, tested in test_signals.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner, Result

from phasegate.cli import main
from phasegate.envelope import phase_message
from phasegate.settings import Settings
from tests.helpers import make_settings, settings_env
from tests.integration.test_cli_control import sql, value


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    return make_settings(database_url, queue_pair, sqs_endpoint)


@pytest.fixture
def cli(settings: Settings) -> Iterator[Any]:
    env = {**settings_env(settings), "PHASEGATE_WORKFLOW_MODULES": "tests.workflows_waits",
           "PHASEGATE_LOG_FORMAT": "json", "PHASEGATE_API_URL": ""}
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(main, list(args), env=env, catch_exceptions=False)

    yield invoke


def add_waiting_run(settings: Settings, workflow_id: str) -> None:
    """A signalled run whose phase `ask` (seq 0) committed a wait for `approval`."""
    sql(settings, "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
        "next_seq, current_phase, due_at, waiting_for) VALUES ($1, 'signalled', 1, "
        "'waiting', 1, 'act', now() + interval '1 hour', 'approval')", workflow_id)
    message = phase_message(workflow_id, "signalled", 1, "act")
    sql(settings, "INSERT INTO outbox (workflow_id, seq, dedup_id, group_id, body, due_at) "
        "VALUES ($1, 1, $2, $3, $4, now() + interval '1 hour')", workflow_id,
        message.dedup_id, message.group_id, message.to_json())


def test_inspect_shows_the_wait_and_signal_delivers_it(cli: Any, settings: Settings) -> None:
    add_waiting_run(settings, "w-1")
    shown = cli("inspect", "w-1")
    assert shown.exit_code == 0
    assert "status:    waiting" in shown.output
    due = value(settings, "SELECT due_at FROM workflow_runs")
    assert f"due_at:    {due.astimezone(UTC).isoformat(timespec='seconds')}" \
        in shown.output
    assert "waiting_for: approval" in shown.output
    as_json = json.loads(cli("inspect", "w-1", "-o", "json").output)["run"]
    assert (as_json["status"], as_json["waiting_for"]) == ("waiting", "approval")
    assert datetime.fromisoformat(as_json["due_at"]) == due
    result = cli("signal", "w-1", "approval", "--payload", '{"ok": true}',
                 "--idempotency-key", "t-1")
    assert result.exit_code == 0, result.output
    assert "delivered" in result.output
    assert value(settings, "SELECT due_at <= now() FROM outbox WHERE seq = 1") is True
    assert value(settings, "SELECT consumed_seq FROM signals") == 1
    again = cli("signal", "w-1", "approval", "--payload", "1", "--idempotency-key", "t-1")
    assert again.exit_code == 0 and "duplicate" in again.output
    assert value(settings, "SELECT count(*) FROM signals") == 1


def test_signal_refusals_exit_nonzero_and_store_nothing(cli: Any, settings: Settings) -> None:
    add_waiting_run(settings, "w-2")
    sql(settings, "UPDATE workflow_runs SET status = 'completed', finished_at = now()")
    bad_json = cli("signal", "w-2", "approval", "--payload", "{not json")
    assert bad_json.exit_code == 2 and "not JSON" in bad_json.output
    missing = cli("signal", "nope", "approval")
    assert missing.exit_code == 1 and "no workflow run" in missing.output
    finished = cli("signal", "w-2", "approval")
    assert finished.exit_code == 1 and "completed" in finished.output
    bad_name = cli("signal", "w-2", "bad name")
    assert bad_name.exit_code == 2 and "signal name" in bad_name.output
    # The API's rule for a key, on the way to the database too.
    bad_key = cli("signal", "w-2", "approval", "--idempotency-key", "line\nbreak")
    assert bad_key.exit_code == 2
    assert bad_key.output == "phasegate: an idempotency key is 1-200 visible ASCII " \
        "characters (no spaces)\n"
    assert value(settings, "SELECT count(*) FROM signals") == 0
