"""A plain advance's own commit statement (migration 0027, ``advance_phase``) against real
PostgreSQL: it writes what the general commit writes for a phase that advanced with its
successor sent now (run row, position with no chain lease, checkpoint, outbox row), loses its
row the same way (stale, duplicate, cancelled), ends a chain's lease, and only the worker role
may call it."""

from __future__ import annotations

import pytest

from phasegate.sql import queries
from phasegate.store import Lease
from tests.helpers import fetch, store_for
from tests.integration.test_access import denied, store_as
from tests.integration.test_continued_commit import (
    TRACEPARENT,
    general_commit,
    hop,
    written,
)
from tests.integration.test_group_commit import running

OUTBOX_COLUMNS = "branch, seq, group_id, body, due_at, wait_signal, sent_at, lease_holder"


@pytest.mark.parametrize("fields", [
    {},
    {"tier": 2, "tier_label": "gold", "resource_versions_json": '{"doc": "v7"}',
     "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "review_json": '{"note": "kept"}',
     "outcome": "retry", "rerun_of": 0, "error": "below its tier"},
], ids=["plain", "every-column"])
async def test_a_plain_advance_writes_what_the_general_commit_writes(database_url, fields):
    """Two runs, two advances each: one through advance_phase (the store, each commit alone),
    one through commit_phase. Run row, position, checkpoints and outbox rows come out the
    same, and each advance hands back its outbox row's id to send."""
    async with store_for(database_url) as store:
        assert store.group_commit is None  # each commit alone: the lean statement itself
        await running(store, "pa-lean", "pa-general")
        for seq in range(2):
            lean = await store.commit_phase(hop("pa-lean", seq, **fields))
            assert lean is not None and lean[1] is not None
            general = await general_commit(store, hop("pa-general", seq, **fields), None)
            assert general is not None and general["outbox_id"] is not None
    lean_rows = await written(database_url, "pa-lean", OUTBOX_COLUMNS)
    assert lean_rows == await written(database_url, "pa-general", OUTBOX_COLUMNS)
    run, position, checkpoints, outbox = lean_rows
    assert run[:3] == ("running", 2, "p2")
    assert position is not None and position[5:] == (None, None, None)
    assert [c[1] for c in checkpoints] == [0, 1]
    assert [row[1] for row in outbox] == ["1", "2"]
    assert all(row[4:] == ("None",) * 4 for row in outbox)  # due now, unsent, no lease
    assert f'"traceparent":"{TRACEPARENT}"' in outbox[0][3]


async def test_the_last_hop_of_a_chain_ends_its_lease(database_url):
    """A chain's hop leaves a lease on the position; the hop that hands off through SQS is a
    plain advance, which clears it as commit_phase does."""
    async with store_for(database_url) as store:
        await running(store, "pa-chain")
        assert await store.commit_phase(hop("pa-chain", 0), lease=Lease("w-1", 600.0))
        leased = await written(database_url, "pa-chain", OUTBOX_COLUMNS)
        assert leased[1] is not None and leased[1][5] == "w-1"
        handed_off = await store.commit_phase(hop("pa-chain", 1))
    assert handed_off is not None and handed_off[1] is not None
    run, position, _, outbox = await written(database_url, "pa-chain", OUTBOX_COLUMNS)
    assert run[:2] == ("running", 2)
    assert position is not None and position[5:] == (None, None, None)
    assert [row[1] for row in outbox] == ["2"]


async def test_a_stale_duplicate_or_cancelled_advance_commits_nothing(database_url):
    async with store_for(database_url) as store:
        await running(store, "pa-stale", "pa-dup", "pa-cancelled")
        assert await store.commit_phase(hop("pa-stale", 3)) is None
        assert await store.commit_phase(hop("pa-dup")) is not None
        assert await store.commit_phase(hop("pa-dup")) is None
        await fetch(database_url, "UPDATE workflow_runs SET status = 'cancelled' "
                    "WHERE workflow_id = 'pa-cancelled'")
        assert await store.commit_phase(hop("pa-cancelled")) is None
    stale, dup, cancelled = [await written(database_url, w)
                             for w in ("pa-stale", "pa-dup", "pa-cancelled")]
    assert stale[0][:2] == ("running", 0) and stale[2] == [] and stale[3] == []
    assert dup[0][:2] == ("running", 1) and len(dup[2]) == 1 and len(dup[3]) == 1
    assert cancelled[0][:2] == ("cancelled", 0) and cancelled[2] == [] and cancelled[3] == []


async def test_only_the_worker_role_may_commit_a_plain_advance(database_url):
    async with store_for(database_url) as store:
        await running(store, "pa-role", "pa-denied")
    async with store_as(database_url, "phasegate_worker") as worker:
        assert await worker.commit_phase(hop("pa-role")) is not None
    async with (store_as(database_url, "phasegate_orchestrator") as orchestrator,
                orchestrator.pool.acquire() as connection):
        commit = hop("pa-denied")
        successor = commit.successor
        assert successor is not None
        assert await denied(
            connection, queries()["advance_phase"], commit.workflow_id, "main", 0, "p0",
            1, commit.state_json, commit.state_hash, "p1", None, None, None, "w-1", None,
            None, None, None, None, successor.dedup_id, successor.group_id,
            successor.to_json())
    assert (await written(database_url, "pa-role"))[0][1] == 1
    assert (await written(database_url, "pa-denied"))[0][1] == 0
