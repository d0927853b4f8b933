"""Chain leases (migration 0020) against real PostgreSQL and a real SQS server: a continued
hop writes no outbox row; its run's position holds the lease (and, since 0030, is brought up
to the run row by the heartbeat while the lease lives); a chain ends in order through
its holder, or is rescued once its lease has run out, exactly once; any other writer that
moves the run ends it; the roles may do what their process needs and no more."""

from __future__ import annotations

import json

import asyncpg

from phasegate import chains
from phasegate.envelope import Envelope, canonical_json, phase_message, start_message, state_hash
from phasegate.migrate import migrate
from phasegate.orchestrator.relay import Relay
from phasegate.sql import migration_files, queries
from phasegate.store import Lease, PhaseCommit, Store
from tests.helpers import fetch, fetchval, queue_for, store_for
from tests.integration.test_access import denied, store_as

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def continued(workflow_id: str, seq: int) -> PhaseCommit:
    canonical = canonical_json({"seq": seq})
    return PhaseCommit(
        workflow_id=workflow_id, branch="main", seq=seq, phase=f"p{seq}", schema_version=1,
        state_json=canonical, state_hash=state_hash(canonical), next_phase=f"p{seq + 1}",
        status="running", worker_id="w-1",
        successor=phase_message(workflow_id, "wf", seq + 1, f"p{seq + 1}",
                                traceparent=TRACEPARENT))


async def chained(store: Store, workflow_id: str, hops: int = 2, lease_s: float = 600.0) -> None:
    """A run whose worker ``w-1`` committed ``hops`` phases, each leasing the next to itself."""
    await store.start_run(workflow_id=workflow_id, workflow="wf", schema_version=1, input={},
                          first_phase="p0", message=start_message(workflow_id, "wf", {}))
    assert await store.load_for_phase(workflow_id) is not None
    for seq in range(hops):
        result = await store.commit_phase(continued(workflow_id, seq), lease=Lease("w-1", lease_s))
        assert result is not None and result[1] is None  # committed; no outbox row


async def expire(database_url: str, workflow_id: str) -> None:
    """What a dead worker leaves: a lease nobody extends, run out."""
    await fetch(database_url, "UPDATE run_positions SET chain_until = now() - interval '1 s' "
                "WHERE workflow_id = $1", workflow_id)


async def position(database_url: str, workflow_id: str) -> tuple[int, str | None, str | None]:
    rows = await fetch(database_url, "SELECT next_seq, chain_holder, chain_traceparent "
                       "FROM run_positions WHERE workflow_id = $1", workflow_id)
    return rows[0]["next_seq"], rows[0]["chain_holder"], rows[0]["chain_traceparent"]


async def test_a_continued_hop_writes_no_row_and_its_holder_ends_the_chain_once(database_url):
    async with store_for(database_url) as store:
        await chained(store, "cl-own")
        assert await fetchval(database_url, "SELECT count(*) FROM outbox WHERE seq > 0") == 0
        # The second hop held a live lease and left the position to the heartbeat (0030).
        assert await position(database_url, "cl-own") == (1, "w-1", TRACEPARENT)
        successor = phase_message("cl-own", "wf", 2, "p2")
        body = successor.to_json()
        # Another worker, or the wrong seq, ends nothing.
        assert await store.end_chain(successor, body, holder="w-2") is None
        wrong = phase_message("cl-own", "wf", 3, "p3")
        assert await store.end_chain(wrong, wrong.to_json(), holder="w-1") is None
        outbox_id = await store.end_chain(successor, body, holder="w-1")
        assert outbox_id is not None
        assert await store.end_chain(successor, body, holder="w-1") is None  # once
        assert await position(database_url, "cl-own") == (2, None, None)
        row = await store.successor("cl-own", "main", 2)
        assert row is not None and row.outbox_id == outbox_id and row.body == body
        assert not row.leased and row.sent_at is None and row.dedup_id == successor.dedup_id
        # No chain any more: nothing to extend.
        assert await store.extend_chains(["cl-own"], Lease("w-1", 600.0)) == set()


async def test_a_chain_holding_its_lease_leaves_its_position_to_the_heartbeat(database_url):
    """0030: the first hop of a chain writes the position with the lease; the hops after it,
    while the lease is live, write only the run row and the checkpoint. The holder's heartbeat
    brings the position up to the run row, its updated_at the last checkpoint's time."""
    async with store_for(database_url) as store:
        await chained(store, "cl-hb", hops=3)
        assert await position(database_url, "cl-hb") == (1, "w-1", TRACEPARENT)
        # Nothing reads the lagging position as a stall.
        stalls = await store.pool.fetch(queries("control.sql")["stalls"], 60.0, 10)
        assert stalls == []
        assert await store.extend_chains(["cl-hb"], Lease("w-1", 600.0)) == {"cl-hb"}
        assert await position(database_url, "cl-hb") == (3, "w-1", TRACEPARENT)
        moved = await fetchval(database_url, "SELECT created_at FROM checkpoints "
                               "WHERE workflow_id = 'cl-hb' AND seq = 2")
        phase, updated_at = (await fetch(database_url, "SELECT current_phase, updated_at "
                                         "FROM run_positions WHERE workflow_id = 'cl-hb'"))[0]
        assert (phase, updated_at) == ("p3", moved)
        # A heartbeat with nothing new moves nothing but the lease.
        assert await store.extend_chains(["cl-hb"], Lease("w-1", 600.0)) == {"cl-hb"}
        assert await fetchval(database_url, "SELECT updated_at FROM run_positions "
                              "WHERE workflow_id = 'cl-hb'") == moved


async def test_a_hop_whose_lease_runs_low_writes_the_position(database_url):
    """A chain whose heartbeat did not come (less than half a lease left): its next hop writes
    the position and the lease again, as every hop did before 0030."""
    async with store_for(database_url) as store:
        await chained(store, "cl-low", hops=2)
        assert await position(database_url, "cl-low") == (1, "w-1", TRACEPARENT)
        await fetch(database_url, "UPDATE run_positions SET chain_until = now() + "
                    "interval '100 s' WHERE workflow_id = 'cl-low'")
        result = await store.commit_phase(continued("cl-low", 2), lease=Lease("w-1", 600.0))
        assert result is not None and result[1] is None
        assert await position(database_url, "cl-low") == (3, "w-1", TRACEPARENT)
        assert await fetchval(database_url, "SELECT chain_until > now() + interval '590 s' "
                              "FROM run_positions WHERE workflow_id = 'cl-low'")


async def test_a_writer_that_keeps_the_seq_keeps_a_lagging_chain(database_url):
    """The position trigger ends a chain only when the run row leaves the chain's seq, read
    from the run row: a position a heartbeat behind is no reason (0030)."""
    async with store_for(database_url) as store:
        await chained(store, "cl-tier", hops=3)
        await fetch(database_url, "UPDATE workflow_runs SET tier = 4, updated_at = now() "
                    "WHERE workflow_id = 'cl-tier'")
        assert await position(database_url, "cl-tier") == (3, "w-1", TRACEPARENT)


async def test_a_chain_leased_before_0030_goes_on_after_it(empty_database_url):
    """A chain whose hops all wrote the position (v29) when the migration comes: its next hop
    leaves the position, the heartbeat catches it up, a rescue sends the run row's seq; the
    migration's file run once more changes nothing."""
    url = empty_database_url
    await migrate(url, target=29)
    async with store_for(url) as store:
        await chained(store, "cl-v29", hops=2)
    assert await position(url, "cl-v29") == (2, "w-1", TRACEPARENT)
    report = await migrate(url, target=30)
    assert [int(applied[:4]) for applied in report.applied] == [30]
    sql = next(text for version, _, text in migration_files() if version == 30)
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()
    async with store_for(url) as store:
        result = await store.commit_phase(continued("cl-v29", 2), lease=Lease("w-1", 600.0))
        assert result is not None and result[1] is None
        assert await position(url, "cl-v29") == (2, "w-1", TRACEPARENT)
        assert await store.extend_chains(["cl-v29"], Lease("w-1", 600.0)) == {"cl-v29"}
        assert await position(url, "cl-v29") == (3, "w-1", TRACEPARENT)
        result = await store.commit_phase(continued("cl-v29", 3), lease=Lease("w-1", 600.0))
        assert result is not None
        await expire(url, "cl-v29")
        [dead] = await store.expired_chains(10)
        row = await chains.rescue(store, dead)
        assert row is not None and Envelope.model_validate_json(row.body).seq == 4
        assert await position(url, "cl-v29") == (4, None, None)


async def test_a_retry_leaves_its_row_leased_to_the_holder_until_the_backoff_ends(database_url):
    async with store_for(database_url) as store:
        await chained(store, "cl-retry")
        successor = phase_message("cl-retry", "wf", 2, "p2")
        assert await store.end_chain(successor, successor.to_json(), holder="w-1",
                                     lease=Lease("w-1", 600.0)) is not None
        row = await store.successor("cl-retry", "main", 2)
        assert row is not None and row.leased
        # The relay's claim leaves a live lease alone (it takes the unsent start message).
        claimed = await store.claim_unsent(0.0, 10, Lease("relay", 30.0))
        assert row.outbox_id not in {r.outbox_id for r in claimed}


async def test_an_expired_chain_is_rebuilt_from_the_run_and_rescued_once(database_url):
    async with store_for(database_url) as store:
        await chained(store, "cl-dead", hops=3)
        await chained(store, "cl-live", hops=1)
        assert await store.expired_chains(10) == []
        live = await store.chain_of("cl-live", 1)
        assert live is not None and live.live
        assert await chains.rescue(store, live) is None  # a live chain is not rescued
        await expire(database_url, "cl-dead")
        dead = await store.chain_of("cl-dead", 3)
        assert dead is not None and not dead.live
        assert [c.workflow_id for c in await store.expired_chains(10)] == ["cl-dead"]
        row = await chains.rescue(store, dead, Lease("relay-1", 30.0))
        assert row is not None
        message = Envelope.model_validate_json(row.body)
        assert (message.kind, message.workflow_id, message.workflow, message.seq,
                message.phase, message.branch, message.traceparent) == (
            "phase", "cl-dead", "wf", 3, "p3", "main", TRACEPARENT)
        assert row.dedup_id == phase_message("cl-dead", "wf", 3, "p3").dedup_id
        # Exactly one rescuer writes it; the dead worker's heartbeat finds nothing to extend.
        assert await chains.rescue(store, dead) is None
        assert await store.expired_chains(10) == []
        assert await store.extend_chains(["cl-dead", "cl-live"], Lease("w-1", 600.0)) \
            == {"cl-live"}
        assert await fetchval(database_url, "SELECT lease_holder FROM outbox "
                              "WHERE workflow_id = 'cl-dead' AND seq = 3") == "relay-1"


async def test_the_relay_sends_an_expired_chain(settings):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        await chained(store, "cl-relay")
        relay = Relay(store=store, queue=queue, after_s=settings.relay_after_s)
        assert await relay.rescue_chains() == 0
        await expire(settings.database_url, "cl-relay")
        assert await relay.rescue_chains() == 1
        received = await queue.receive(max_messages=10, wait_time_s=5, visibility_timeout_s=30)
        assert [json.loads(m.body)["seq"] for m in received] == [2]
        assert await fetchval(settings.database_url, "SELECT sent_at IS NOT NULL FROM outbox "
                              "WHERE workflow_id = 'cl-relay' AND seq = 2")
        assert await relay.rescue_chains() == 0


async def test_another_writer_that_moves_the_run_ends_its_chain(database_url):
    """A failed attempt keeps the run at its seq (the chain's retry needs the lease); a halt,
    or anything else that moves the run, ends the chain, so nobody rescues a message for a
    run that is no longer where the chain left it."""
    async with store_for(database_url) as store:
        await chained(store, "cl-fail")
        assert await store.record_failure("cl-fail", 2, "boom", 5) is not None
        assert (await position(database_url, "cl-fail"))[1] == "w-1"
        assert await store.halt_run("cl-fail", 2, "needs_restart", "schema")
        assert (await position(database_url, "cl-fail"))[1] is None
        await chained(store, "cl-moved")
        await fetch(database_url, "UPDATE workflow_runs SET next_seq = 5, updated_at = now() "
                    "WHERE workflow_id = 'cl-moved'")
        assert await position(database_url, "cl-moved") == (5, None, None)
        await expire(database_url, "cl-moved")
        assert await store.expired_chains(10) == []


async def test_the_orchestrator_role_rescues_and_cannot_extend(database_url):
    """The relay runs with the orchestrator's role: it may read expired chains and rescue them
    (EXECUTE phasegate_end_chain), not hold or extend a chain, nor write positions itself."""
    async with store_for(database_url) as store:
        await chained(store, "cl-role")
    await expire(database_url, "cl-role")
    async with store_as(database_url, "phasegate_orchestrator") as orchestrator:
        [dead] = await orchestrator.expired_chains(10)
        assert await chains.rescue(orchestrator, dead, Lease("relay-1", 30.0)) is not None
        async with orchestrator.pool.acquire() as connection:
            assert await denied(connection, "SELECT phasegate_extend_chains("
                                "ARRAY['cl-role'], 'w-1', 60)")
            assert await denied(connection, "UPDATE run_positions SET chain_holder = 'x'")
    assert await position(database_url, "cl-role") == (2, None, None)
