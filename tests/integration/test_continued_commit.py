"""A continued hop's own commit statement (migration 0021, ``continue_phase``) against real
PostgreSQL: it writes what the general commit writes for a continued hop (run row, position
and chain lease, checkpoint; the run row's updated_at left to the position; since 0030 the
position of a chain holding its lease left to the heartbeat), loses its row the
same way (stale, duplicate, cancelled), and only the worker role may call it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from phasegate.envelope import canonical_json, phase_message, state_hash
from phasegate.sql import queries
from phasegate.store import Lease, PhaseCommit, Store
from tests.helpers import fetch, fetchval, store_for
from tests.integration.test_access import denied, store_as
from tests.integration.test_group_commit import behind_a_held_head, grouped_store, running

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
RUN_COLUMNS = ("status, next_seq, current_phase, attempts, error, due_at, waiting_for, tier, "
               "tier_label, review, finished_at")
POSITION_COLUMNS = ("status, next_seq, current_phase, tier, tier_label, chain_holder, "
                    "chain_traceparent, round(extract(epoch FROM chain_until - updated_at)) "
                    "AS lease_s")
CHECKPOINT_COLUMNS = ("branch, seq, phase, kind, schema_version, state, state_hash, tier, "
                      "tier_label, resource_versions, worker_id, trace_id, outcome, rerun_of")


def hop(workflow_id: str, seq: int = 0, **fields: Any) -> PhaseCommit:
    canonical = canonical_json({"seq": seq})
    commit = PhaseCommit(
        workflow_id=workflow_id, branch="main", seq=seq, phase=f"p{seq}", schema_version=1,
        state_json=canonical, state_hash=state_hash(canonical), next_phase=f"p{seq + 1}",
        status="running", worker_id="w-1",
        successor=phase_message(workflow_id, "wf", seq + 1, f"p{seq + 1}",
                                traceparent=TRACEPARENT))
    return replace(commit, **fields)


async def general_commit(store: Store, commit: PhaseCommit, lease: Lease | None) -> Any:
    """The same commit through the general statement (commit_phase), as a worker of the
    previous release commits it (``lease``: a continued hop's; none for a plain advance)."""
    successor = commit.successor
    assert successor is not None
    return await store.pool.fetchrow(
        queries()["commit_phase"], commit.workflow_id, commit.branch, commit.seq,
        commit.phase, commit.schema_version, commit.state_json, commit.state_hash,
        commit.next_phase, commit.status, commit.tier, commit.tier_label,
        commit.resource_versions_json, commit.worker_id, commit.trace_id, successor.dedup_id,
        successor.group_id, successor.to_json(), commit.outcome, commit.rerun_of,
        commit.error, commit.review_json, None, None, None,
        lease.holder if lease else None, lease.seconds if lease else 0.0, None)


async def written(database_url: str, workflow_id: str,
                  outbox_columns: str = "seq") -> tuple[Any, ...]:
    """The run row, its position, its checkpoints and its successors' outbox rows
    (``outbox_columns``, as text, the run's own id replaced, so two runs' rows compare)."""
    run = await fetch(database_url, f"SELECT {RUN_COLUMNS} FROM workflow_runs "
                      "WHERE workflow_id = $1", workflow_id)
    position = await fetch(database_url, f"SELECT {POSITION_COLUMNS} FROM run_positions "
                           "WHERE workflow_id = $1", workflow_id)
    checkpoints = await fetch(database_url, f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints "
                              "WHERE workflow_id = $1 ORDER BY seq", workflow_id)
    outbox = await fetch(database_url, f"SELECT {outbox_columns} FROM outbox "
                         "WHERE workflow_id = $1 AND seq > 0 ORDER BY seq", workflow_id)
    rows = [tuple(str(v).replace(workflow_id, "<id>") for v in row) for row in outbox]
    return (tuple(run[0]), tuple(position[0]) if position else None,
            [tuple(c) for c in checkpoints], rows)


async def after_heartbeat(database_url: str, lease: Lease,
                          *workflow_ids: str) -> list[tuple[Any, ...]]:
    """Each run's rows (``written``) once the lease holder's heartbeat has run: the positions
    brought up to their run rows. The lease's length is left out (the heartbeat restarts it)
    and checked to be at least the lease."""
    async with store_for(database_url) as store:
        assert await store.extend_chains(list(workflow_ids), lease) == set(workflow_ids)
    rows = []
    for workflow_id in workflow_ids:
        run, position, checkpoints, outbox = await written(database_url, workflow_id)
        assert position is not None and position[-1] >= lease.seconds
        rows.append((run, position[:-1], checkpoints, outbox))
    return rows


@pytest.mark.parametrize("fields", [
    {},
    {"tier": 2, "tier_label": "gold", "resource_versions_json": '{"doc": "v7"}',
     "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "review_json": '{"note": "kept"}'},
], ids=["plain", "every-column"])
async def test_a_continued_hop_writes_what_the_general_commit_writes(database_url, fields):
    """Two runs, two hops each: one through continue_phase (the store), one through
    commit_phase with the same lease (a worker of the previous release). Run row, position,
    chain lease, checkpoints and (no) outbox rows come out the same."""
    lease = Lease("w-1", 600.0)
    async with store_for(database_url) as store:
        assert store.group_commit is None  # each hop alone: the lean statement itself
        await running(store, "cc-lean", "cc-general")
        for seq in range(2):
            lean = await store.commit_phase(hop("cc-lean", seq, **fields), lease=lease)
            assert lean is not None and lean[1] is None  # committed, no outbox row
            general = await general_commit(store, hop("cc-general", seq, **fields), lease)
            assert general is not None and general["committed_at"] is not None
    lean_rows, general_rows = (await written(database_url, "cc-lean"),
                               await written(database_url, "cc-general"))
    # The second hop held a live lease, so it left the position where the first put it
    # (0030); everything else is the same.
    assert lean_rows[0] == general_rows[0] and lean_rows[2:] == general_rows[2:]
    assert lean_rows[1] == (*general_rows[1][:1], 1, "p1", *general_rows[1][3:])
    lean_rows, general_rows = await after_heartbeat(database_url, lease, "cc-lean",
                                                    "cc-general")
    assert lean_rows == general_rows
    run, position, checkpoints, outbox = lean_rows
    assert run[:3] == ("running", 2, "p2")
    assert position is not None and position[5:] == ("w-1", TRACEPARENT)
    assert [c[1] for c in checkpoints] == [0, 1] and outbox == []


@pytest.mark.parametrize("fields", [
    {},
    {"tier": 2, "tier_label": "gold", "resource_versions_json": '{"doc": "v7"}',
     "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "review_json": '{"note": "kept"}'},
], ids=["plain", "every-column"])
async def test_hops_committed_together_write_what_the_general_commit_writes(database_url,
                                                                          fields):
    """Two runs' hops batched by group commit (continue_phases, migration 0024: every call of
    the batch a continued hop), twice, against a run whose hops go through commit_phase with
    the same lease: the same run row, position, chain lease, checkpoints and (no) outbox
    rows."""
    lease = Lease("w-1", 600.0)
    async with grouped_store(database_url) as store:
        await running(store, "cc-g-head", "cc-g-1", "cc-g-2", "cc-g-general")
        for seq in range(2):
            head, results = await behind_a_held_head(
                database_url, store, (hop("cc-g-head", seq), lease),
                [(hop(w, seq, **fields), lease) for w in ("cc-g-1", "cc-g-2")])
            assert head is not None
            for result in results:
                assert isinstance(result, tuple) and result[1] is None
            general = await general_commit(store, hop("cc-g-general", seq, **fields), lease)
            assert general is not None and general["committed_at"] is not None
        group = store.group_commit
        assert group is not None and (group.statements, group.alone_batches) == (2, 2)
    grouped = [await written(database_url, w) for w in ("cc-g-1", "cc-g-2")]
    general_rows = await written(database_url, "cc-g-general")
    # As a hop alone: the second hops left the positions to the heartbeat (0030).
    assert grouped[0] == grouped[1]
    assert grouped[0][0] == general_rows[0] and grouped[0][2:] == general_rows[2:]
    assert grouped[0][1] == (*general_rows[1][:1], 1, "p1", *general_rows[1][3:])
    *grouped, general_rows = await after_heartbeat(database_url, lease, "cc-g-1", "cc-g-2",
                                                   "cc-g-general")
    assert grouped[0] == grouped[1] == general_rows
    run, position, checkpoints, outbox = grouped[0]
    assert run[:3] == ("running", 2, "p2")
    assert position is not None and position[5:] == ("w-1", TRACEPARENT)
    assert [c[1] for c in checkpoints] == [0, 1] and outbox == []


async def test_a_stale_duplicate_or_cancelled_hop_commits_nothing(database_url):
    """Each hop alone: a hop at a seq the run has left, the second of two deliveries of one
    hop, and a hop of a run cancelled meanwhile get None back and write nothing."""
    lease = Lease("w-1", 600.0)
    async with store_for(database_url) as store:
        await running(store, "cc-stale", "cc-dup", "cc-cancelled")
        assert await store.commit_phase(hop("cc-stale", 3), lease=lease) is None
        assert await store.commit_phase(hop("cc-dup"), lease=lease) is not None
        assert await store.commit_phase(hop("cc-dup"), lease=Lease("w-2", 600.0)) is None
        await fetch(database_url, "UPDATE workflow_runs SET status = 'cancelled' "
                    "WHERE workflow_id = 'cc-cancelled'")
        assert await store.commit_phase(hop("cc-cancelled"), lease=lease) is None
    stale, dup, cancelled = [await written(database_url, w)
                             for w in ("cc-stale", "cc-dup", "cc-cancelled")]
    assert stale[0][:2] == ("running", 0) and stale[2] == []
    assert dup[0][:2] == ("running", 1) and len(dup[2]) == 1
    assert dup[1] is not None and dup[1][5] == "w-1"  # the first delivery's lease stands
    assert cancelled[0][:2] == ("cancelled", 0) and cancelled[1] is None
    assert cancelled[2] == []


async def test_a_hop_that_does_not_continue_takes_the_general_statement(database_url):
    """Only a running, leased hop with a successor and no wait is a continued hop: a commit
    that ends the run, one that waits, and one without a lease go through commit_phase."""
    async with store_for(database_url) as store:
        await running(store, "cc-done", "cc-wait", "cc-plain")
        done = await store.commit_phase(
            hop("cc-done", status="completed", next_phase=None, successor=None),
            lease=Lease("w-1", 600.0))
        waited = await store.commit_phase(hop("cc-wait", wait_s=3600.0),
                                          lease=Lease("w-1", 600.0))
        plain = await store.commit_phase(hop("cc-plain"))
    assert done is not None and waited is not None and plain is not None
    assert plain[1] is not None  # its successor's row, to send now
    assert (await written(database_url, "cc-done"))[0][0] == "completed"
    # The wait is kept (continue_phase would have left the run running).
    assert (await written(database_url, "cc-wait"))[0][0] == "waiting"


async def test_only_the_worker_role_may_commit_a_continued_hop(database_url):
    """continue_phase runs with its owner's rights (it writes the position): the worker role
    may call it, the orchestrator's may not."""
    async with store_for(database_url) as store:
        await running(store, "cc-role", "cc-denied")
    async with store_as(database_url, "phasegate_worker") as worker:
        assert await worker.commit_phase(hop("cc-role"), lease=Lease("w-1", 60.0)) is not None
    async with (store_as(database_url, "phasegate_orchestrator") as orchestrator,
                orchestrator.pool.acquire() as connection):
        commit = hop("cc-denied")
        assert await denied(
            connection, queries()["continue_phase"], commit.workflow_id, "main", 0, "p0",
            1, commit.state_json, commit.state_hash, "p1", None, None, None, "w-1", None,
            None, None, None, None, "w-1", 60.0, TRACEPARENT)
        assert await denied(
            connection, queries()["continue_phases"], [commit.workflow_id], ["main"], [0],
            ["p0"], [1], [commit.state_json], [commit.state_hash], ["p1"], [None], [None],
            [None], ["w-1"], [None], [None], [None], [None], [None], ["w-1"], [60.0],
            [TRACEPARENT])
    assert (await written(database_url, "cc-role"))[0][1] == 1
    assert (await written(database_url, "cc-denied"))[0][1] == 0


async def test_a_chain_moves_the_positions_updated_at_which_the_api_and_stalls_read(
        database_url):
    """A commit that leaves its run running (a continued hop, 0021; a plain one, 0023) leaves
    the run row's updated_at (so the row's WAL record stops before the run's input) and moves
    the position's: the API's run and run list show the later of the two, and the stall
    report, which reads the position, does not see a stall. The run's end moves the row's."""
    control = queries("control.sql")
    async with store_for(database_url) as store:
        await running(store, "cc-time")
        # The run last moved an hour ago; then its worker runs three hops locally.
        await fetch(database_url, "UPDATE workflow_runs SET updated_at = now() - interval "
                    "'1 hour' WHERE workflow_id = 'cc-time'")
        for seq in range(3):
            assert await store.commit_phase(hop("cc-time", seq),
                                            lease=Lease("w-1", 600.0)) is not None
        run_at = await fetchval(database_url, "SELECT updated_at FROM workflow_runs "
                                "WHERE workflow_id = 'cc-time'")
        position_at = await fetchval(database_url, "SELECT updated_at FROM run_positions "
                                     "WHERE workflow_id = 'cc-time'")
        fresh = await fetchval(database_url, "SELECT now() - interval '1 minute'")
        assert run_at < fresh < position_at
        shown = await store.pool.fetchrow(control["get_run"], "cc-time")
        assert shown["updated_at"] == position_at and shown["next_seq"] == 3
        listed = await store.pool.fetch(
            control["list_runs"].replace("/*filters*/", "AND workflow_id = $2"), 10, "cc-time")
        assert [row["updated_at"] for row in listed] == [position_at]
        stalls = await store.pool.fetch(control["stalls"], 60.0, 10)
        assert [row for row in stalls if row["phase"] == "p3"] == []
        # The chain hands off through SQS: the general commit leaves the run running, and
        # the run row's updated_at too (migration 0023); the run's end moves it.
        assert await store.commit_phase(hop("cc-time", 3)) is not None
        assert await fetchval(database_url, "SELECT updated_at FROM workflow_runs "
                              "WHERE workflow_id = 'cc-time'") == run_at
        assert await store.commit_phase(hop("cc-time", 4, status="completed", next_phase=None,
                                            successor=None)) is not None
        assert await fetchval(database_url, "SELECT updated_at FROM workflow_runs "
                              "WHERE workflow_id = 'cc-time'") > fresh
