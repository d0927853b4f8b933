"""Duplicate delivery and the outbox relay, against real PostgreSQL and SQS."""

from __future__ import annotations

import pytest

from phasegate.envelope import phase_message, start_message
from phasegate.orchestrator.relay import Relay
from phasegate.orchestrator.starter import start_workflow
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    queue_for,
    running_worker,
    send_raw,
    spawn_worker,
    stop_process,
    store_for,
    wait_for,
)

REGISTRY = Registry([workflows.chain])


async def test_same_start_sent_twice_makes_one_run(settings):
    start = start_message("dup-start", "chain", {"n": 1})
    # Different dedup ids, so SQS delivers both: the engine must still make one run.
    await send_raw(settings, start.to_json(), group=start.group_id, dedup="a" * 64)
    await send_raw(settings, start_message("dup-start", "chain", {"n": 999}).to_json(),
                   group=start.group_id, dedup="b" * 64)
    async with running_worker(settings, REGISTRY) as worker:
        await wait_for(lambda: all_done(settings.database_url, ["dup-start"]), what="done")
        await wait_for(lambda: _queue_drained(worker), what="queue drained")
    assert await fetchval(settings.database_url, "SELECT count(*) FROM workflow_runs") == 1
    assert await fetchval(settings.database_url,
                          "SELECT input->>'n' FROM workflow_runs") == "1"
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM checkpoints WHERE kind = 'phase'") == 3
    ran = await fetch(settings.database_url,
                      "SELECT phase, count(*) AS n FROM test_invocations GROUP BY phase")
    assert {r["phase"]: r["n"] for r in ran} == {"fetch": 1, "transform": 1, "publish": 1}


async def _queue_drained(worker) -> bool:
    depth = await worker.queue.depth()
    return depth.visible == 0 and depth.inflight == 0 and worker.held == 0


async def test_redelivered_phase_message_commits_once_and_successor_sent_once(settings):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        started = await start_workflow(store, queue, workflow=workflows.chain, input={"n": 1})
        wid = started.workflow_id
        async with running_worker(settings, REGISTRY) as worker:
            await wait_for(lambda: all_done(settings.database_url, [wid]), what="done")
            # Replay seq 1 (transform) well after it committed, bypassing SQS dedup.
            replay = phase_message(wid, "chain", 1, "transform")
            await send_raw(settings, replay.to_json(), group=replay.group_id, dedup="c" * 64)
            await wait_for(lambda: _queue_drained(worker), what="duplicate consumed")
    rows = await fetch(settings.database_url, "SELECT seq, count(*) AS n FROM checkpoints "
                       "WHERE kind = 'phase' GROUP BY seq ORDER BY seq")
    assert [(r["seq"], r["n"]) for r in rows] == [(0, 1), (1, 1), (2, 1)]
    assert await fetchval(settings.database_url, "SELECT count(*) FROM test_invocations "
                          "WHERE phase = 'transform'") == 1
    # At most one successor row per seq, each sent: the replay wrote and sent nothing. (A
    # hop the worker continued itself leaves no row: its commit deleted it, never sent.)
    outbox = await fetch(settings.database_url,
                         "SELECT seq, sent_at FROM outbox ORDER BY seq")
    seqs = [r["seq"] for r in outbox]
    assert seqs[0] == 0 and seqs == sorted(set(seqs)) and set(seqs) <= {0, 1, 2}
    assert all(r["sent_at"] is not None for r in outbox)


@pytest.mark.parametrize(("continuation", "leased_send"),
                         [(False, False), (False, True), (True, True)],
                         ids=["outbox", "leased-send", "continued"])
async def test_crash_between_commit_and_send_is_healed_by_the_relay(settings, continuation,
                                                                   leased_send):
    """SIGKILL right after the commit of seq 0. With neither continuation nor leased sends the
    successor is in the outbox, unsent; otherwise (the worker was going to send seq 1, or to
    run it itself) the run's position holds a lease and there is no row. The relay (no worker
    running) sends it -- the row, or the message rebuilt from the run once the lease has run
    out --; a new worker then finishes the run."""
    settings = settings.model_copy(update={"continuation": continuation,
                                           "leased_send": leased_send})
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        wid = (await start_workflow(store, queue, workflow=workflows.chain,
                                    input={"n": 2})).workflow_id
        crashing = spawn_worker(settings, extra_env={"PHASEGATE_FAULTS": "after_commit"})
        try:
            assert crashing.wait(timeout=60) == -9
        finally:
            stop_process(crashing)
        unsent = await fetch(settings.database_url,
                             "SELECT seq FROM outbox WHERE sent_at IS NULL")
        assert [r["seq"] for r in unsent] == ([] if leased_send else [1])
        assert await fetchval(settings.database_url, "SELECT next_seq FROM workflow_runs") == 1
        holder = await fetchval(settings.database_url, "SELECT chain_holder FROM run_positions")
        assert (holder is not None) is leased_send
        # A leased send's holder is told apart from a chain's.
        assert (holder or "").endswith("/sent") is (leased_send and not continuation)

        relay = Relay(store=store, queue=queue, after_s=settings.relay_after_s, interval_s=0.1)

        async def relayed() -> bool:
            await relay.rescue_chains()
            await relay.relay_once()
            return relay.relayed == 1

        await wait_for(relayed, what="relay sent the stranded successor")
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run completed")
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM checkpoints WHERE kind = 'phase'") == 3
    assert await fetchval(settings.database_url, "SELECT count(*) FROM test_invocations "
                          "WHERE phase = 'fetch'") == 1


async def test_two_relays_never_send_a_row_twice_at_once(settings):
    """Rows claimed with SKIP LOCKED: two relays racing split the rows between them."""
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        for i in range(30):
            message = start_message(f"relay-{i:02d}", "chain", None)
            await store.start_run(workflow_id=f"relay-{i:02d}", workflow="chain",
                                  schema_version=1, input={"n": i}, first_phase="fetch",
                                  message=message)
        first = Relay(store=store, queue=queue, after_s=0, batch=7)
        second = Relay(store=store, queue=queue, after_s=0, batch=7)
        import asyncio

        while await fetchval(settings.database_url,
                             "SELECT count(*) FROM outbox WHERE sent_at IS NULL"):
            await asyncio.gather(first.relay_once(), second.relay_once())
        assert first.relayed + second.relayed == 30
        depth = await queue.depth()
        assert depth.visible + depth.inflight == 30
