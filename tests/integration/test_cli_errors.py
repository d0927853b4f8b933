"""What a person sees when settings are wrong or the database is down."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, make_settings, settings_env


def phasegate(*args: str, env: dict[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PHASEGATE_")}
    return subprocess.run([sys.executable, "-m", "phasegate.cli", *args],
                          env={**clean, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize(("env", "variable"), [
    ({}, "PHASEGATE_DATABASE_URL"),
    ({"PHASEGATE_DATABASE_URL": "mysql://x"}, "PHASEGATE_DATABASE_URL"),
    ({"PHASEGATE_CONCURRENCY": "lots"}, "PHASEGATE_CONCURRENCY"),
    ({"PHASEGATE_CONCURRENCY": "0"}, "PHASEGATE_CONCURRENCY"),
    ({"PHASEGATE_VISIBILITY_TIMEOUT_S": "99999"}, "PHASEGATE_VISIBILITY_TIMEOUT_S"),
    ({"PHASEGATE_LOG_LEVEL": "loud"}, "PHASEGATE_LOG_LEVEL"),
])
async def test_bad_setting_exits_2_with_one_line_naming_the_variable(env, variable):
    done = phasegate("worker", env=env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert variable in lines[0] and lines[0].startswith("phasegate: invalid setting")


async def test_heartbeat_not_shorter_than_visibility_is_refused():
    done = phasegate("worker", env={"PHASEGATE_HEARTBEAT_S": "40",
                                    "PHASEGATE_VISIBILITY_TIMEOUT_S": "30"})
    assert done.returncode == 2
    assert "heartbeat_s must be shorter than visibility_timeout_s" in done.stderr


async def test_unimportable_workflow_module_names_the_setting(database_url, queue_pair,
                                                              sqs_endpoint):
    env = settings_env(make_settings(database_url, queue_pair, sqs_endpoint))
    done = phasegate("worker", env={**env, "PHASEGATE_WORKFLOW_MODULES": "no.such.module"})
    assert done.returncode == 2
    assert "PHASEGATE_WORKFLOW_MODULES" in done.stderr and "no.such" in done.stderr


async def test_database_down_worker_waits_then_says_what_it_waited_for(queue_pair,
                                                                       sqs_endpoint):
    from phasegate.orchestrator.embedded import free_port

    down = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    env = settings_env(make_settings(down, queue_pair, sqs_endpoint,
                                     startup_timeout_s=2.0))
    done = phasegate("worker", env={**env, "PHASEGATE_WORKFLOW_MODULES": "tests.workflows",
                                    "PHASEGATE_LOG_FORMAT": "json"})
    assert done.returncode == 1
    assert "waiting_for_dependencies" in done.stderr and "postgres" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "phasegate: gave up after 2s waiting for postgres")


async def test_migrate_against_a_down_database_is_a_clear_error():
    from phasegate.orchestrator.embedded import free_port

    done = phasegate("migrate", env={
        "PHASEGATE_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/x"})
    assert done.returncode == 1
    assert done.stderr.startswith("phasegate: cannot reach PostgreSQL")


async def test_start_unknown_workflow_is_refused(database_url, queue_pair, sqs_endpoint):
    env = settings_env(make_settings(database_url, queue_pair, sqs_endpoint))
    done = phasegate("start", "no-such-flow", "--input", "{}",
                     env={**env, "PHASEGATE_WORKFLOW_MODULES": "tests.workflows"})
    assert done.returncode == 2
    assert "unknown workflow 'no-such-flow'" in done.stderr


async def test_start_prints_the_id_and_is_idempotent(database_url, queue_pair, sqs_endpoint):
    from tests.helpers import fetchval

    env = {**settings_env(make_settings(database_url, queue_pair, sqs_endpoint)),
           "PHASEGATE_WORKFLOW_MODULES": "tests.workflows"}
    first = phasegate("start", "chain", "--input", '{"n": 1}', "--id", "cli-1", env=env)
    assert first.returncode == 0 and first.stdout.strip() == "cli-1"
    again = phasegate("start", "chain", "--input", '{"n": 2}', "--id", "cli-1", env=env)
    assert again.returncode == 0 and "already existed" in again.stderr
    assert await fetchval(database_url, "SELECT input->>'n' FROM workflow_runs") == "1"
    bad = phasegate("start", "chain", "--input", "{nope", env=env)
    assert bad.returncode == 2 and "--input is not valid JSON" in bad.stderr


@pytest.mark.parametrize("command", [["status"], ["inspect", "wf-never-started"]])
async def test_a_database_never_migrated_is_named_not_a_traceback(empty_database_url, command):
    done = phasegate(*command, env={"PHASEGATE_DATABASE_URL": empty_database_url,
                                    "PHASEGATE_WORKFLOW_MODULES": "tests.workflows"})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["phasegate: the database has no phasegate schema: run `phasegate migrate` "
                     "against it first"], done.stderr
