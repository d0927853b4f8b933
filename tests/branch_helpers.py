"""Helpers shared by the branch integration tests (tests/integration/test_branch*.py and
test_branches*.py): fork, fan-in, race, deadline, nesting, review, doors inside branches.

Runs through the queue: test modules import the fixture ``settings_fixture``; tests ask for it
as ``settings``. Runs written straight into Postgres (the forced-overlap tests): a run is
started with ``started_run``, forked with ``commit_a_fork``, its branches loaded with
``load_branches`` and finished with ``commit_branch_phase``; ``released_together`` holds the
fork row until every commit waits on it, then lets them race.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from click.testing import CliRunner

from phasegate.branches import (
    BranchPosition,
    Committed,
    ForkPlan,
    commit_branch,
    commit_fork,
    load_branch,
    plan_fork,
)
from phasegate.cli import main
from phasegate.envelope import canonical_json, phase_message, start_message, state_hash
from phasegate.orchestrator.relay import Relay
from phasegate.orchestrator.starter import start_workflow
from phasegate.settings import Settings
from phasegate.store import PhaseCommit, Store
from phasegate.workflow import Workflow
from tests import workflows
from tests.helpers import (
    fetch,
    fetchval,
    make_settings,
    queue_for,
    settings_env,
    store_for,
    wait_for,
)
from tests.workflows import branch_gate
from tests.workflows_tree import nest

# -- runs through the queue -----------------------------------------------------------------------


def branch_settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str,
                    **overrides: Any) -> Settings:
    """Eight phases at once, so a fork's branches run side by side; the phases record their
    invocations in this test's database."""
    workflows.LEDGER_DSN = database_url
    return make_settings(database_url, queue_pair, sqs_endpoint, concurrency=8, **overrides)


@pytest.fixture(name="settings")
def settings_fixture(database_url: str, queue_pair: tuple[str, str],
                     sqs_endpoint: str) -> Settings:
    return branch_settings(database_url, queue_pair, sqs_endpoint)


async def start(settings: Settings, workflow: Workflow, input: Any) -> str:
    async with store_for(settings.database_url or "") as store, queue_for(settings) as queue:
        return (await start_workflow(store, queue, workflow=workflow, input=input)).workflow_id


async def relay_stranded(settings: Settings) -> None:
    """What the orchestrator's relay does: send outbox rows a dead worker left unsent."""
    async with store_for(settings.database_url or "") as store, queue_for(settings) as queue:
        relay = Relay(store=store, queue=queue, after_s=settings.relay_after_s, interval_s=0.1)

        async def none_unsent() -> bool:
            await relay.relay_once()
            return not await fetchval(settings.database_url or "",
                                      "SELECT count(*) FROM outbox WHERE sent_at IS NULL")

        await wait_for(none_unsent, what="the relay sent every stranded message")


async def inspect(settings: Settings, modules: str, wid: str, *options: str) -> str:
    """``phasegate inspect WID OPTIONS`` against the database (no API), its output."""
    env = {**settings_env(settings), "PHASEGATE_WORKFLOW_MODULES": modules,
           "PHASEGATE_LOG_FORMAT": "json", "PHASEGATE_API_URL": ""}
    # The CLI runs its own event loop: give it a thread.
    result = await asyncio.to_thread(CliRunner().invoke, main, ["inspect", wid, *options],
                                     env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return str(result.output)


async def inspect_tree(settings: Settings, modules: str, wid: str) -> list[str]:
    return (await inspect(settings, modules, wid, "--tree")).splitlines()


async def open_gate(settings: Settings, name: str) -> None:
    await fetch(settings.database_url or "", "INSERT INTO test_gates VALUES ($1)", name)


async def open_gates(settings: Settings, gate: str, n: int) -> None:
    """The gates of branches 0 .. n-1 (``branch_gate``); a gate already open stays open."""
    for i in range(n):
        await fetch(settings.database_url or "",
                    "INSERT INTO test_gates VALUES ($1) ON CONFLICT DO NOTHING",
                    branch_gate(gate, i))


# -- what the runs left ---------------------------------------------------------------------------


async def count(settings: Settings, sql: str, *args: Any) -> int:
    return int(await fetchval(settings.database_url or "", sql, *args))


async def ran(settings: Settings, phase: str, branch: str | None = None) -> int:
    """How often ``phase`` really ran (``test_invocations``), in ``branch`` or anywhere."""
    return await count(settings, "SELECT count(*) FROM test_invocations WHERE phase = $1 "
                       "AND ($2::text IS NULL OR note = $2)", phase, branch)


async def main_state(settings: Settings, wid: str, phase: str) -> Any:
    """The state ``phase`` committed on the main chain."""
    return json.loads(await fetchval(
        settings.database_url or "", "SELECT state::text FROM checkpoints WHERE "
        "workflow_id = $1 AND branch = 'main' AND phase = $2 AND kind = 'phase'", wid, phase))


async def main_states(settings: Settings, wid: str, phase: str) -> list[Any]:
    """Every state ``phase`` committed on the main chain (a merge phase: one per round)."""
    rows = await fetch(settings.database_url or "", "SELECT state::text FROM checkpoints "
                       "WHERE workflow_id = $1 AND branch = 'main' AND phase = $2 "
                       "AND kind = 'phase' ORDER BY seq", wid, phase)
    return [json.loads(r["state"]) for r in rows]


async def branch_statuses(settings: Settings, wid: str) -> dict[str, str]:
    rows = await fetch(settings.database_url or "", "SELECT branch, status FROM branches "
                       "WHERE workflow_id = $1", wid)
    return {r["branch"]: r["status"] for r in rows}


def discarded_checkpoints(settings: Settings, wid: str, n: int) -> Callable[[], Awaitable[bool]]:
    """A condition: at least ``n`` results of a lost race (or a supervisor merge) recorded as
    discarded checkpoints."""
    async def check() -> bool:
        return await count(settings, "SELECT count(*) FROM checkpoints WHERE workflow_id = $1 "
                           "AND kind = 'discarded'", wid) >= n
    return check


# -- runs written straight into Postgres ----------------------------------------------------------

NESTED_PARENT = "f0.b0"


def phase_commit(workflow_id: str, branch: str, seq: int, phase: str, state: object,
                 next_phase: str | None) -> PhaseCommit:
    canonical = canonical_json(state)
    return PhaseCommit(workflow_id=workflow_id, branch=branch, seq=seq, phase=phase,
                       schema_version=1, state_json=canonical, state_hash=state_hash(canonical),
                       next_phase=next_phase, status="running", worker_id="test")


async def started_run(store: Store, workflow: Workflow, workflow_id: str, first_phase: str,
                      input: Any) -> None:
    await store.start_run(workflow_id=workflow_id, workflow=workflow.name, schema_version=1,
                          input=input, first_phase=first_phase,
                          message=start_message(workflow_id, workflow.name, None))
    assert await store.load_for_phase(workflow_id) is not None  # pending -> running


async def commit_a_fork(store: Store, workflow: Workflow, plan: ForkPlan, workflow_id: str,
                        seq: int, phase: str, state: object,
                        next_phase: str | None) -> Committed:
    """The forking phase's commit, on the plan's parent chain (main or a branch)."""
    return await commit_fork(
        store, phase_commit(workflow_id, plan.parent, seq, phase, state, next_phase), plan,
        phase_message(workflow_id, workflow.name, seq, phase, plan.parent))


async def load_branches(store: Store, workflow_id: str,
                        names: Sequence[str]) -> list[BranchPosition]:
    positions = []
    for name in names:
        position = await load_branch(store, workflow_id, name)
        assert position is not None
        positions.append(position)
    return positions


async def commit_branch_phase(store: Store, workflow: Workflow, position: BranchPosition,
                              seq: int, phase: str, state: object) -> Committed:
    """A branch phase's commit with no next phase named: the branch's final commit."""
    envelope = phase_message(position.workflow_id, workflow.name, seq, phase, position.branch)
    commit = phase_commit(position.workflow_id, position.branch, seq, phase, state, None)
    return await commit_branch(store, commit, position, envelope, workflow)


async def nested_parent(store: Store, workflow_id: str) -> BranchPosition:
    """A `nest` run whose `outer` phase forked one branch, ``NESTED_PARENT``, at main seq 0."""
    await started_run(store, nest, workflow_id, "outer", {})
    outer = plan_fork(nest, "outer", 0, "main", [{"o": 0}], "join_outer", "all", None)
    assert (await commit_a_fork(store, nest, outer, workflow_id, 0, "outer", {}, None)).committed
    [parent] = await load_branches(store, workflow_id, [NESTED_PARENT])
    return parent


async def waiting_on_locks(database_url: str) -> int:
    return int(await fetchval(
        database_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'"))


async def wait_until_waiting(database_url: str, n: int, what: str) -> None:
    async def waiting() -> bool:
        return await waiting_on_locks(database_url) == n
    await wait_for(waiting, timeout=30, what=what)


@asynccontextmanager
async def fork_row_locked(database_url: str, workflow_id: str,
                          parent_branch: str | None = None
                          ) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """A third connection holds the fork row (of ``parent_branch``, or the run's only fork)
    until the yielded ``release`` is awaited: commits started meanwhile queue on it."""
    holder = await asyncpg.connect(database_url)
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.fetchrow("SELECT 1 FROM forks WHERE workflow_id = $1 AND "
                              "($2::text IS NULL OR parent_branch = $2) FOR UPDATE",
                              workflow_id, parent_branch)
        yield hold.rollback
    finally:
        await holder.close()


async def released_together(database_url: str, workflow_id: str, *commits: Awaitable[Any],
                            parent_branch: str | None = None,
                            what: str = "every commit waiting on the fork row") -> list[Any]:
    """The overlap forced, not hoped for: ``commits`` start while the fork row is held; once
    Postgres shows all of them waiting on it, it is released and they race for it."""
    async with fork_row_locked(database_url, workflow_id, parent_branch) as release:
        gathered = asyncio.gather(*commits)
        await wait_until_waiting(database_url, len(commits), what)
        await release()
        return list(await gathered)
