"""Chain leases (migration 0020) against real PostgreSQL and a real SQS server: a continued
hop writes no outbox row; its run's position holds the lease; a chain ends in order through
its holder, or is rescued once its lease has run out, exactly once; any other writer that
moves the run ends it; the roles may do what their process needs and no more."""

from __future__ import annotations

import json

from phasegate import chains
from phasegate.envelope import Envelope, canonical_json, phase_message, start_message, state_hash
from phasegate.orchestrator.relay import Relay
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
        assert await position(database_url, "cl-own") == (2, "w-1", TRACEPARENT)
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
