"""Outbox leases and the relay's lease-based claim (migration 0008), against real PostgreSQL
(directly and through PgBouncer in transaction mode) and a real SQS server."""

from __future__ import annotations

from phasegate.envelope import start_message
from phasegate.orchestrator.relay import Relay
from phasegate.store import Store
from tests.helpers import (
    fetch,
    fetchval,
    queue_for,
    settings_env,
    store_for,
    wait_for,
)


async def _start(store: Store, wid: str) -> None:
    await store.start_run(workflow_id=wid, workflow="chain", schema_version=1, input={"n": 1},
                          first_phase="fetch", message=start_message(wid, "chain", None))


async def test_relay_and_ensure_successor_leave_a_live_lease_alone(settings):
    """A row leased to a (continuing) worker is nobody else's to send until the lease
    expires; then the relay sends it on its next round, without waiting relay_after_s."""
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        await _start(store, "leased")
        await store.pool.execute("UPDATE outbox SET lease_holder = 'worker-a', "
                                 "lease_until = now() + interval '1 hour'")
        relay = Relay(store=store, queue=queue, after_s=0, interval_s=0.1)
        assert await relay.relay_once() == 0
        row = await store.successor("leased", "main", 0)
        assert row is not None and row.leased and row.sent_at is None
        assert (await queue.depth()).visible == 0
        assert await store.outbox_lag_s() == 0  # a live lease is not lag

        # The worker died: its lease runs out (database time) and the row is due at once,
        # although relay_after_s is long.
        await store.pool.execute("UPDATE outbox SET lease_until = now() - interval '1 second'")
        patient = Relay(store=store, queue=queue, after_s=3600, interval_s=0.1)
        assert await patient.relay_once() == 1
        assert (await queue.depth()).visible == 1
        row = await store.successor("leased", "main", 0)
        assert row is not None and row.sent_at is not None


async def test_worker_heartbeat_extends_only_its_own_leases(settings):
    from phasegate.store import Lease

    async with store_for(settings.database_url) as store:
        await _start(store, "mine")
        await store.pool.execute("UPDATE outbox SET lease_holder = 'worker-a', "
                                 "lease_until = now() + interval '1 second'")
        (outbox_id,) = [r["outbox_id"] for r in await store.pool.fetch(
            "SELECT outbox_id FROM outbox")]
        assert await store.extend_leases([outbox_id], Lease("worker-b", 600)) == set()
        assert await store.extend_leases([outbox_id], Lease("worker-a", 600)) == {outbox_id}
        left = await store.pool.fetchval(
            "SELECT extract(epoch FROM lease_until - now()) FROM outbox")
        assert left > 500
        await store.release_leases([outbox_id], "worker-a")
        assert await store.pool.fetchval("SELECT lease_until FROM outbox") is None


async def test_relay_claim_commits_before_the_send_and_holds_no_lock(settings):
    """The claim is one committed statement: while the relay is between claim and send, the
    rows are leased (visible to everyone) and not locked (an UPDATE does not wait)."""
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        await _start(store, "claimed")
        relay = Relay(store=store, queue=queue, after_s=0, claim_ttl_s=60, relay_id="relay-a")
        rows = await relay.claim()
        assert [r.dedup_id for r in rows] != []
        holder = await fetchval(settings.database_url,
                                "SELECT lease_holder FROM outbox WHERE lease_until > now()")
        assert holder == "relay-a"
        # Another connection can write the row at once (no lock held across the send).
        await store.pool.execute("UPDATE outbox SET body = body")
        assert await relay.send_claimed(rows) == 1
        assert await fetchval(settings.database_url,
                              "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0


async def test_relay_killed_between_claim_and_send_leaves_rows_to_another(settings):
    """A real `phasegate relay` process SIGKILLed after its claim committed: its rows stay
    unsent while the claim lives, then a second relay sends them, each exactly once."""
    import asyncio
    import os
    import sys

    from tests.helpers import ROOT

    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        for i in range(5):
            await _start(store, f"relay-kill-{i}")
        env = {**os.environ, **settings_env(settings), "PHASEGATE_FAULTS": "relay_claimed",
               "PHASEGATE_RELAY_AFTER_S": "0", "PHASEGATE_RELAY_CLAIM_TTL_S": "2",
               "PYTHONPATH": str(ROOT)}
        dying = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "phasegate.cli", "relay", env=env, cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        try:
            code = await asyncio.wait_for(dying.wait(), 60)
        finally:
            if dying.returncode is None:
                dying.kill()
                await dying.wait()
        assert code == -9
        claimed = await fetch(settings.database_url, "SELECT lease_holder, sent_at FROM outbox "
                              "WHERE lease_until > now() - interval '1 minute'")
        assert len(claimed) == 5
        assert all(r["lease_holder"].startswith("relay:") and r["sent_at"] is None
                   for r in claimed)
        assert (await queue.depth()).visible == 0

        survivor = Relay(store=store, queue=queue, after_s=0, interval_s=0.1)

        async def all_sent() -> bool:
            await survivor.relay_once()
            return survivor.relayed == 5

        await wait_for(all_sent, timeout=30, what="the survivor sent the dead relay's rows")
        depth = await queue.depth()
        assert depth.visible == 5
        assert await fetchval(settings.database_url,
                              "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0
