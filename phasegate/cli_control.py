"""Control-plane commands: ``orchestrator``, ``status``, ``inspect``, ``cancel|retry|restart|
approve|reject``, ``signal``, ``purge``. Registered on the ``phasegate`` group in
``phasegate/cli.py``.

Each control command talks to the orchestrator's API with ``--api URL`` (or
``PHASEGATE_API_URL``), sending the bearer token in ``PHASEGATE_API_TOKEN``, and to the
database directly otherwise.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, NoReturn

import click

from phasegate.orchestrator import render
from phasegate.orchestrator.backends import (
    DECISIONS,
    ApiBackend,
    Backend,
    BackendError,
    DatabaseBackend,
)
from phasegate.signals import MAX_KEY_CHARS

API_OPTION = click.option(
    "--api", "api_url", envvar="PHASEGATE_API_URL",
    help="The orchestrator's URL (PHASEGATE_API_URL; the token is read from "
         "PHASEGATE_API_TOKEN); without it, the database directly.")


OUTPUT_OPTION = click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="text: tables for people; json: the API's JSON, one document.")


def _api_token() -> str | None:
    from phasegate.client import token_from_environment

    try:
        return token_from_environment()
    except OSError as exc:
        click.echo(f"phasegate: cannot read PHASEGATE_API_TOKEN_FILE: {exc}", err=True)
        raise SystemExit(2) from None


def _backend(api_url: str | None, *, needs_registry: bool = False,
             role: str | None = None) -> Backend:
    from phasegate.cli import load_registry, require, settings_from

    settings = settings_from()
    if api_url:
        return ApiBackend(api_url, token=_api_token())
    require(settings, "database_url")
    return DatabaseBackend(settings, load_registry(settings, required=needs_registry),
                           role=role)


def _fail(error: BackendError) -> NoReturn:
    from phasegate.cli import fail

    hint = " (set PHASEGATE_API_TOKEN, or PHASEGATE_API_TOKEN_FILE, to a token from " \
        "`phasegate token new`)" \
        if error.status == 401 else ""
    fail(f"{error}{hint}", 1 if error.status in (0, 404, 409) else 2)


@click.command()
@click.option("--host", help="Listen address (PHASEGATE_API_HOST; default 127.0.0.1).")
@click.option("--port", type=int, help="Listen port (PHASEGATE_API_PORT; default 8080).")
@click.option("--no-relay", is_flag=True, envvar="PHASEGATE_NO_RELAY",
              help="Do not run the outbox relay in this process.")
@click.option("--exporter-interval", type=float, default=5.0, show_default=True,
              envvar="PHASEGATE_EXPORTER_INTERVAL_S", help="Seconds between queue polls.")
@click.option("--fleet-deployment", envvar="PHASEGATE_FLEET_DEPLOYMENT",
              default="phasegate-worker", show_default=True,
              help="The worker Deployment the fleet view reads.")
@click.option("--fleet-namespace", envvar="PHASEGATE_FLEET_NAMESPACE",
              help="Its namespace (default: the pod's own).")
def orchestrator(host: str | None, port: int | None, no_relay: bool, exporter_interval: float,
                 fleet_deployment: str, fleet_namespace: str | None) -> None:
    """Serve the HTTP API, run the outbox relay, the queue-depth exporter and the scheduler
    until SIGTERM."""
    from phasegate.cli import fail, load_registry, require, run_until_signal, settings_from
    from phasegate.orchestrator.server import Orchestrator, OrchestratorOptions
    from phasegate.settings import SettingsError, exit_on_settings_error

    settings = require(settings_from(api_host=host, api_port=port), "database_url", "queue_url")
    registry = load_registry(settings, required=False)
    instance = Orchestrator(settings, registry, OrchestratorOptions(
        host=settings.api_host, port=settings.api_port, relay=not no_relay,
        exporter_interval_s=exporter_interval, fleet_deployment=fleet_deployment,
        fleet_namespace=fleet_namespace))

    try:
        instance.authenticator()  # a bad auth setting exits 2 now, before anything connects
        instance.schedules()  # so does a schedule clash (PHASEGATE_SCHEDULES)
    except SettingsError as exc:
        exit_on_settings_error(exc)

    async def run() -> None:
        try:
            await instance.run()
        except SettingsError as exc:
            exit_on_settings_error(exc)
        except OSError as exc:
            fail(f"cannot start the orchestrator: {type(exc).__name__}: {exc}")

    run_until_signal(run, instance.stop)


@click.command()
@API_OPTION
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", type=float, default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.option("--count", type=int, default=None, hidden=True,
              help="Stop --watch after this many refreshes.")
@OUTPUT_OPTION
def status(api_url: str | None, watch: bool, interval: float, count: int | None,
           output: str) -> None:
    """A table of runs by status, workflow, phase and tier, with queue depth and the fleet."""
    backend = _backend(api_url)
    color = sys.stdout.isatty()
    try:
        if output == "json":
            fleet = backend.fleet()
            click.echo(json.dumps({**backend.summary(), "fleet": fleet["fleet"],
                                   "workers": fleet.get("workers"), "ages": fleet.get("ages")},
                                  indent=2))
            return
        if watch and color:  # a terminal: redraw in place
            render.watch(lambda: render.status_view(backend.summary(), backend.fleet()),
                         interval=interval, count=count)
            return
        shown = 0
        while True:  # a pipe: one plain block per refresh, each under a timestamped header
            text = render.status(backend.summary(), backend.fleet(), color=color)
            if watch:
                click.echo(time.strftime("%H:%M:%S ") + "phasegate status (Ctrl-C to stop)")
            click.echo(text)
            shown += 1
            if not watch or (count is not None and shown >= count):
                break
            time.sleep(interval)  # the refresh rate of a human-facing display
    except BackendError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        pass
    finally:
        backend.close()


@click.command()
@API_OPTION
@click.argument("workflow_id")
@click.option("--state", "include_state", is_flag=True, help="Show each checkpoint's state.")
@click.option("--json", "as_json", is_flag=True, help="The same as -o json.")
@click.option("--role", envvar="PHASEGATE_ROLE", help="Your role for the read policy when "
              "reading the database directly (PHASEGATE_ROLE); with --api, the token's roles "
              "decide which phases' state you see.")
@click.option("--tree", is_flag=True, help="Draw the branch DAG (forks, branches, merges).")
@OUTPUT_OPTION
def inspect(api_url: str | None, workflow_id: str, include_state: bool, as_json: bool,
            role: str | None, tree: bool, output: str) -> None:
    """A run and its history: checkpoints and operator actions."""
    from phasegate.access import ROLE_PATTERN

    as_json = as_json or output == "json"

    if role is not None and not ROLE_PATTERN.fullmatch(role):
        click.echo("phasegate: --role must be 1-64 chars of [A-Za-z0-9_.:-]", err=True)
        raise SystemExit(2)
    backend = _backend(api_url, role=role)
    try:
        run = backend.run(workflow_id)
        history = backend.checkpoints(workflow_id, include_state)
        actions = backend.actions(workflow_id)
        forks = backend.branches(workflow_id)["forks"] if tree else None
    except BackendError as exc:
        _fail(exc)
    finally:
        backend.close()
    if forks is not None:
        from phasegate.orchestrator.render_tree import tree as draw_tree

        click.echo(json.dumps({"run": run, "forks": forks}, indent=2) if as_json
                   else draw_tree(run, history["checkpoints"], forks,
                                  color=sys.stdout.isatty()))
        return
    if as_json:
        click.echo(json.dumps({"run": run, "checkpoints": history["checkpoints"],
                               "actions": actions["actions"]}, indent=2))
        return
    click.echo(render.inspect(run, history["checkpoints"], actions["actions"],
                              include_state=include_state, color=sys.stdout.isatty()))


def _action_command(action: str, help_text: str) -> click.Command:
    @click.command(name=action, help=help_text)
    @API_OPTION
    @click.argument("workflow_id")
    @click.option("--reason", help="Why (kept in the run's action log).")
    @OUTPUT_OPTION
    def command(api_url: str | None, workflow_id: str, reason: str | None,
                output: str, idempotency_key: str | None = None) -> None:
        backend = _backend(api_url, needs_registry=action == "restart")
        try:
            result = backend.act(action, workflow_id, reason, idempotency_key)
        except BackendError as exc:
            _fail(exc)
        finally:
            backend.close()
        click.echo(json.dumps(result, indent=2) if output == "json"
                   else render.action(result))

    if action in DECISIONS:  # a review decision is made once per key; a retry gets its answer
        command = click.option(
            "--idempotency-key",
            help=f"1-{MAX_KEY_CHARS} visible ASCII characters. A retry with the same key "
                 "prints the first answer and changes nothing (without one, a retry is "
                 "refused: the run is no longer awaiting review).")(command)
    return command


cancel = _action_command("cancel", "Cancel a run (a phase running now commits nothing).")
retry = _action_command("retry", "Resume a failed run from its last committed checkpoint.")
restart = _action_command("restart", "Run a needs_restart run again from its input.")
approve = _action_command("approve", "Continue a run that is awaiting review.")
reject = _action_command("reject", "Re-run the phase of a run that is awaiting review.")


@click.command()
@click.option("--older-than", "older_than", envvar="PHASEGATE_RETENTION",
              help="Age of finished runs to delete: 7d, 12h, 30m (PHASEGATE_RETENTION). "
                   "Without it, PHASEGATE_RETENTION_BY_CLASSIFICATION gives one age per "
                   "classification.")
@click.option("--classification", type=click.Choice(
    ["public", "internal", "sensitive", "regulated"]), help="Only runs of this classification.")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=500, show_default=True,
              help="Runs deleted per statement.")
@OUTPUT_OPTION
def purge(older_than: str | None, classification: str | None, dry_run: bool,
          batch_size: int, output: str) -> None:
    """Delete finished runs (with checkpoints and outbox rows) older than an age, in every
    store (PHASEGATE_STORES), per classification when retention is set per classification."""
    from datetime import timedelta

    from phasegate.cli import fail, require, settings_from
    from phasegate.db import pool_from_settings
    from phasegate.orchestrator.purge import PurgeReport, parse_age, parse_retention
    from phasegate.orchestrator.purge import purge as run_purge
    from phasegate.residency import DEFAULT_REGION

    settings = require(settings_from(), "database_url")
    ages: dict[str | None, timedelta]
    try:
        if older_than is not None:
            ages = {classification: parse_age(older_than)}
        elif settings.retention_by_classification:
            ages = {k: v for k, v in parse_retention(
                settings.retention_by_classification).items()
                if classification in (None, k)}
        else:
            fail("--older-than (PHASEGATE_RETENTION) or "
                 "PHASEGATE_RETENTION_BY_CLASSIFICATION is required", 2)
    except ValueError as exc:
        fail(f"--older-than: {exc}", 2)

    async def run() -> list[tuple[str, str | None, PurgeReport]]:
        reports = []
        for region, dsn in sorted(settings.store_map.items()):
            try:
                pool = await pool_from_settings(settings, dsn=dsn, min_size=1, max_size=1)
            except Exception as exc:
                fail(f"cannot reach the PostgreSQL store of region {region!r}: "
                     f"{type(exc).__name__}")
            try:
                for cls, age in ages.items():
                    reports.append((region, cls, await run_purge(
                        pool, age, batch_size=batch_size, dry_run=dry_run,
                        classification=cls)))
            finally:
                await pool.close()
        return reports

    verb = "would delete" if dry_run else "deleted"
    results = asyncio.run(run())
    if output == "json":
        click.echo(json.dumps([
            {"region": region, "classification": cls, "dry_run": dry_run, "runs": report.runs,
             "checkpoints": report.checkpoints, "outbox": report.outbox,
             "batches": report.batches, "older_than_s": report.older_than.total_seconds()}
            for region, cls, report in results], indent=2))
        return
    for region, cls, report in results:
        batches = "" if dry_run else f" in {report.batches} batches"
        where = "" if region == DEFAULT_REGION else f"[{region}] "
        what = f" {cls}" if cls else ""
        age = older_than or render_age(report.older_than)
        click.echo(f"{where}{verb} {report.runs}{what} runs, {report.checkpoints} checkpoints, "
                   f"{report.outbox} outbox rows finished more than {age} ago{batches}")


def render_age(age: Any) -> str:
    seconds = int(age.total_seconds())
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@click.command()
@API_OPTION
@click.argument("workflow_id")
@click.argument("branch")
@click.option("--reason", help="Why (kept in the run's action log).")
@OUTPUT_OPTION
def merge(api_url: str | None, workflow_id: str, branch: str, reason: str | None,
          output: str) -> None:
    """Supervisor merge: promote BRANCH's state to the run's main chain; its siblings are
    discarded and the run goes on after the merge phase."""
    backend = _backend(api_url)
    try:
        result = backend.merge(workflow_id, branch, reason)
    except BackendError as exc:
        _fail(exc)
    finally:
        backend.close()
    click.echo(json.dumps(result, indent=2) if output == "json" else render.action(result))


@click.command(name="list")
@API_OPTION
@click.option("--status", help="Only runs with this status.")
@click.option("--workflow", help="Only runs of this workflow.")
@click.option("--phase", help="Only runs at this phase.")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True,
              help="Runs per page.")
@click.option("--cursor", help="The next page: the cursor the previous page printed.")
@OUTPUT_OPTION
def list_runs(api_url: str | None, status: str | None, workflow: str | None,
              phase: str | None, limit: int, cursor: str | None, output: str) -> None:
    """Runs, newest first, one page (keyset-paged: --cursor continues)."""
    backend = _backend(api_url)
    try:
        page = backend.list_runs({"status": status, "workflow": workflow, "phase": phase,
                                  "limit": limit, "cursor": cursor})
    except BackendError as exc:
        _fail(exc)
    finally:
        backend.close()
    if output == "json":
        click.echo(json.dumps(page, indent=2))
        return
    click.echo(render.runs(page["runs"], color=sys.stdout.isatty()))
    if page.get("next_cursor"):
        click.echo(f"more: --cursor {page['next_cursor']}", err=True)


@click.command()
@API_OPTION
@click.argument("workflow_id")
@click.argument("name")
@click.option("--payload", default="null", show_default=True,
              help="The signal's payload as JSON (the next phase's ctx.signal).")
@click.option("--idempotency-key", help=f"1-{MAX_KEY_CHARS} visible ASCII characters. A "
              "repeat with the same key changes nothing.")
def signal(api_url: str | None, workflow_id: str, name: str, payload: str,
           idempotency_key: str | None) -> None:
    """Send signal NAME to a run: it wakes the run if it waits for NAME
    (ctx.wait_for_signal); otherwise it is kept until the run waits for it, or ends."""
    import json

    try:
        value = json.loads(payload)
    except ValueError as exc:
        click.echo(f"phasegate: --payload is not JSON: {exc}", err=True)
        raise SystemExit(2) from None
    backend = _backend(api_url)
    try:
        result = backend.signal(workflow_id, name, value, idempotency_key)
    except BackendError as exc:
        _fail(exc)
    finally:
        backend.close()
    click.echo(render.signal(result))


COMMANDS = [orchestrator, status, inspect, cancel, retry, restart, approve, reject, purge,
            merge, list_runs, signal]
