"""The ``phasegate`` command line. Each subcommand is a thin shell around a module."""

from __future__ import annotations

import signal
import sys

# A long-running command stopped while Python is still importing (a pod scaled in right after
# it started) holds nothing yet: that is a clean stop too, exit 0, not death by SIGTERM (-15).
# The event loop's own handler replaces this one once the command runs (found by bench/chaos).
if sys.argv[1:2] in (["worker"], ["relay"], ["orchestrator"]):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

import asyncio
import json
from typing import Any, NoReturn

import click

from phasegate.logs import configure_logging
from phasegate.settings import Settings, SettingsError, exit_on_settings_error, load_settings
from phasegate.workflow import Registry, WorkflowDefinitionError


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` (each of its lines: one problem) to stderr and exit with ``code``."""
    for line in message.splitlines() or [""]:
        click.echo(f"phasegate: {line}", err=True)
    raise SystemExit(code)


def settings_from(**flags: Any) -> Settings:
    """Env vars, overridden by the flags a person typed; a bad value exits 2 naming it."""
    try:
        settings = load_settings(**{k: v for k, v in flags.items() if v is not None})
    except SettingsError as exc:
        exit_on_settings_error(exc)
    configure_logging(settings.log_level, settings.log_format)
    return settings


def require(settings: Settings, *fields: str) -> Settings:
    try:
        return settings.require(*fields)
    except SettingsError as exc:
        exit_on_settings_error(exc)


def load_registry(settings: Settings, *, required: bool = True) -> Registry:
    if required:
        require(settings, "workflow_modules")
    try:
        registry = Registry.from_modules(settings.module_list)
    except (ImportError, WorkflowDefinitionError) as exc:
        exit_on_settings_error(SettingsError(
            "PHASEGATE_WORKFLOW_MODULES", str(exc)))
    if required and not len(registry):
        exit_on_settings_error(SettingsError(
            "PHASEGATE_WORKFLOW_MODULES", "the modules define no Workflow"))
    return registry


def run_until_signal(coro_factory: Any, stop: Any) -> None:
    """Run a long-lived coroutine; first SIGTERM/SIGINT calls ``stop``, a second exits."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        signals = {"n": 0}

        def on_signal() -> None:
            signals["n"] += 1
            if signals["n"] > 1:
                import os

                os._exit(1)
            stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await coro_factory()

    asyncio.run(main())


@click.group()
@click.version_option(package_name="phasegate")
def main() -> None:
    """phasegate: durable multi-phase workflows on SQS FIFO + PostgreSQL."""


@main.command()
@click.option("--concurrency", type=int, help="Phases run at once (PHASEGATE_CONCURRENCY).")
@click.option("--modules", "workflow_modules", help="PHASEGATE_WORKFLOW_MODULES.")
def worker(concurrency: int | None, workflow_modules: str | None) -> None:
    """Receive phase messages and run them until SIGTERM."""
    from phasegate.worker.runtime import Worker
    from phasegate.worker.startup import PermanentStartupError, StartupError

    settings = require(settings_from(concurrency=concurrency, workflow_modules=workflow_modules),
                       "database_url", "queue_url", "dlq_url")
    instance = Worker.from_settings(settings, load_registry(settings))

    async def run() -> None:
        try:
            await instance.run()
        except PermanentStartupError as exc:
            fail(str(exc), 2)
        except StartupError as exc:
            fail(str(exc))

    run_until_signal(run, instance.stop)


@main.command()
def relay() -> None:
    """Send outbox rows that workers committed but did not send, until SIGTERM."""
    from phasegate.faults import Faults
    from phasegate.orchestrator.relay import Relay
    from phasegate.queue import SqsQueue
    from phasegate.store import Store

    settings = require(settings_from(), "database_url", "queue_url")
    holder: dict[str, Relay] = {}

    async def run() -> None:
        pool = await _connect_pool(settings)
        try:
            async with SqsQueue(settings.queue_url or "", endpoint_url=settings.sqs_endpoint_url,
                                region=settings.aws_region) as queue:
                holder["relay"] = Relay(
                    store=Store(pool), queue=queue, after_s=settings.relay_after_s,
                    interval_s=settings.relay_interval_s, batch=settings.relay_batch,
                    stall_after_s=settings.relay_stall_after_s,
                    claim_ttl_s=settings.relay_claim_ttl_s,
                    faults=Faults(settings.faults, settings.fault_seed))
                await holder["relay"].run()
        finally:
            await pool.close()

    run_until_signal(run, lambda: holder["relay"].stop() if "relay" in holder else None)


async def _connect_pool(settings: Settings) -> Any:
    from phasegate.db import pool_from_settings

    try:
        return await pool_from_settings(settings, min_size=1, max_size=2)
    except Exception as exc:
        fail(f"cannot reach PostgreSQL at PHASEGATE_DATABASE_URL: {type(exc).__name__}: {exc}")


@main.command()
@click.option("--target", type=int, default=None, help="Stop at this migration number.")
def migrate(target: int | None) -> None:
    """Apply the numbered SQL migrations (under an advisory lock; idempotent)."""
    from phasegate.migrate import migrate as run_migrations
    from phasegate.worker.startup import PERMANENT_DB_ERRORS, one_line

    settings = require(settings_from(), "database_url")
    # Every store of PHASEGATE_STORES gets the same schema (the default store first).
    for region, dsn in sorted(settings.store_map.items(), key=lambda kv: kv[0] != "default"):
        where = "PHASEGATE_DATABASE_URL" if region == "default" else f"region {region!r}"
        try:
            report = asyncio.run(run_migrations(dsn, target=target))
        except PERMANENT_DB_ERRORS as exc:
            fail(f"PostgreSQL refused {where}: {one_line(exc)}", 2)
        except (OSError, TimeoutError) as exc:
            fail(f"cannot reach PostgreSQL at {where}: {one_line(exc)}")
        except Exception as exc:  # one line, never a traceback (a failed migration rolls back)
            fail(f"migrate failed at {where}: {one_line(exc)}")
        applied = ", ".join(report.applied) or "nothing to apply"
        prefix = "" if region == "default" else f"[{region}] "
        click.echo(f"{prefix}schema at version {report.current_version} ({applied})")


@main.command()
@click.argument("workflow_name")
@click.option("--input", "input_json", default="null", help="The start input, as JSON.")
@click.option("--id", "workflow_id", default=None, help="An opaque id (idempotent on it).")
@click.option("--classification", type=click.Choice(
    ["public", "internal", "sensitive", "regulated"]), default=None,
    help="Data classification (default internal); sensitive/regulated need --region.")
@click.option("--region", default=None,
              help="The store (a region of PHASEGATE_STORES) the run lives in; fixed at start.")
@click.option("--api", "api_url", envvar="PHASEGATE_API_URL",
              help="Start through the orchestrator's API at this URL (PHASEGATE_API_URL; the "
                   "token from PHASEGATE_API_TOKEN or PHASEGATE_API_TOKEN_FILE): no database "
                   "or SQS credentials and no workflow code needed here.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="text: the workflow id; json: the run.")
def start(workflow_name: str, input_json: str, workflow_id: str | None,
          classification: str | None, region: str | None, api_url: str | None,
          output: str) -> None:
    """Start WORKFLOW_NAME; prints the workflow id."""
    from phasegate.orchestrator.starter import StartError, start_workflow
    from phasegate.queue import SqsQueue
    from phasegate.residency import DEFAULT_REGION, RegionalStore, ResidencyError, residency

    if api_url:
        _start_through_api(api_url, workflow_name, input_json, workflow_id, classification,
                           region, output)
        return
    settings = require(settings_from(), "database_url", "queue_url")
    registry = load_registry(settings)
    workflow = registry.get(workflow_name)
    if workflow is None:
        fail(f"unknown workflow {workflow_name!r}; loaded: {registry.names()}", 2)
    try:
        payload = json.loads(input_json)
    except ValueError as exc:
        fail(f"--input is not valid JSON: {exc}", 2)

    try:
        store_region = residency(classification, region).store_region
    except ResidencyError as exc:
        fail(str(exc), 2)
    dsn = settings.store_map.get(store_region)
    if dsn is None:  # refused before anything is written anywhere
        fail(f"refused: no store is configured for region {store_region!r} "
             f"(PHASEGATE_STORES has {sorted(settings.store_map)})", 2)

    async def run() -> None:
        pool = await _connect_pool(settings.model_copy(update={"database_url": dsn}))
        try:
            async with SqsQueue(settings.queue_url or "", endpoint_url=settings.sqs_endpoint_url,
                                region=settings.aws_region) as queue:
                started = await start_workflow(
                    RegionalStore(pool, store_region or DEFAULT_REGION), queue,
                    workflow=workflow, input=payload, workflow_id=workflow_id,
                    classification=classification, region=region)
        except StartError as exc:
            fail(str(exc), 2)
        finally:
            await pool.close()
        if output == "json":
            click.echo(json.dumps({"workflow_id": started.workflow_id,
                                   "created": started.created}))
        else:
            click.echo(started.workflow_id)
        if not started.created:
            click.echo("(already existed; nothing started)", err=True)

    asyncio.run(run())


def _start_through_api(api_url: str, workflow_name: str, input_json: str,
                       workflow_id: str | None, classification: str | None,
                       region: str | None, output: str) -> None:
    from phasegate.client import ApiError, Client, token_from_environment

    try:
        payload = json.loads(input_json)
    except ValueError as exc:
        fail(f"--input is not valid JSON: {exc}", 2)
    try:
        token = token_from_environment()
    except OSError as exc:
        fail(f"cannot read PHASEGATE_API_TOKEN_FILE: {exc}", 2)
    try:
        with Client(api_url, token=token) as api:
            run = api.start(workflow_name, payload, workflow_id=workflow_id,
                            classification=classification, region=region)
    except ApiError as exc:
        fail("\n".join(exc.problems), 1 if exc.status in (0, 409, 503) else 2)
    if output == "json":
        click.echo(json.dumps({"workflow_id": run.workflow_id, "workflow": run.workflow,
                               "status": run.status, "seq": run.seq,
                               "current_phase": run.current_phase}))
    else:
        click.echo(run.workflow_id)


@main.command()
@click.option("--workflows", "runs", default=200, show_default=True, help="Runs to start.")
@click.option("--workers", default=3, show_default=True, help="Worker processes.")
@click.option("--no-kill", is_flag=True, help="Do not SIGKILL a worker mid-run.")
def demo(runs: int, workers: int, no_kill: bool) -> None:
    """Everything embedded: Postgres, SQS, workers, relay, sample workflows, a summary."""
    from phasegate.demo import run_demo

    sys.exit(run_demo(runs=runs, workers=workers, kill=not no_kill))


# The control plane's commands need the helpers above.
from phasegate import cli_control  # noqa: E402
from phasegate.orchestrator import cli_token  # noqa: E402

main.add_command(cli_control.orchestrator)
main.add_command(cli_control.status)
main.add_command(cli_control.inspect)
main.add_command(cli_control.cancel)
main.add_command(cli_control.retry)
main.add_command(cli_control.restart)
main.add_command(cli_control.approve)
main.add_command(cli_control.reject)
main.add_command(cli_control.purge)
main.add_command(cli_control.merge)
main.add_command(cli_control.list_runs)
main.add_command(cli_control.signal)
main.add_command(cli_token.token)


@main.command()
@click.option("--modules", "workflow_modules",
              help="The workflow modules about to be rolled out (PHASEGATE_WORKFLOW_MODULES).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per workflow.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: the same as --json.")
@click.option("--max-restart-share", type=click.FloatRange(0, 1), default=None,
              help="Exit 1 when more than this share (0..1) of unfinished runs would stop at "
                   "needs_restart (the chart's pre-upgrade gate).")
def versions(workflow_modules: str | None, as_json: bool, output: str,
             max_restart_share: float | None) -> None:
    """Before a rollout: per workflow, how many unfinished runs the loaded code would resume
    as they are (recoverable), upcast, or stop at needs_restart."""
    from phasegate.versions import format_report, restart_gate, version_report

    settings = require(settings_from(workflow_modules=workflow_modules), "database_url")
    registry = load_registry(settings)
    as_json = as_json or output == "json"

    async def run() -> None:
        pool = await _connect_pool(settings)
        try:
            report = await version_report(pool, registry)
        finally:
            await pool.close()
        if as_json:
            for row in report:
                click.echo(json.dumps(row.as_dict(), sort_keys=True))
        else:
            click.echo(format_report(report))
        if max_restart_share is not None:
            refusal = restart_gate(report, max_restart_share)
            if refusal is not None:
                click.echo(f"upgrade refused: {refusal}", err=True)
                raise SystemExit(1)
            click.echo(f"upgrade allowed: at most {max_restart_share:.1%} of unfinished runs "
                       "would need a restart", err=True)

    asyncio.run(run())


if __name__ == "__main__":
    main()
