"""Local continuation (worker/continuation.py) against real PostgreSQL, a real SQS server and
real worker processes: fewer SQS calls, and every failure of a chain (SIGKILL, a stopped
heartbeat, SIGTERM, a cancel) still ends with each phase committed exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from datetime import timedelta

import asyncpg
from prometheus_client import REGISTRY as METRICS
from structlog.testing import capture_logs

from phasegate.orchestrator.control import Control
from phasegate.orchestrator.starter import start_workflow
from phasegate.settings import Settings
from phasegate.worker.runtime import Worker
from phasegate.workflow import Registry
from tests import workflows_chain
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    make_settings,
    queue_for,
    running_relay,
    running_worker,
    spawn_worker,
    stop_process,
    store_for,
    wait_for,
)
from tests.workflows_chain import PHASES

REGISTRY = Registry([workflows_chain.hops])
MODULES = "tests.workflows_chain"


async def _start(settings: Settings, gate: str | None = None) -> str:
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        started = await start_workflow(store, queue, workflow=workflows_chain.hops,
                                       input={"gate": gate} if gate else {})
    return started.workflow_id


async def _invocations(settings: Settings, phase: str | None = None) -> int:
    return int(await fetchval(
        settings.database_url, "SELECT count(*) FROM test_invocations "
        "WHERE phase = coalesce($1, phase)", phase))


async def _committed_once(settings: Settings) -> None:
    """Each seq has one checkpoint, the state saw every phase once, nothing is left leased."""
    rows = await fetch(settings.database_url, "SELECT seq, count(*) AS n FROM checkpoints "
                       "WHERE kind = 'phase' GROUP BY seq ORDER BY seq")
    assert [(r["seq"], r["n"]) for r in rows] == [(i, 1) for i in range(len(PHASES))]
    final = await fetchval(settings.database_url, "SELECT state->>'n' FROM checkpoints "
                           "WHERE seq = $1", len(PHASES) - 1)
    assert final == str(len(PHASES))
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0


async def _open_gate(settings: Settings, wid: str) -> None:
    await fetch(settings.database_url, "INSERT INTO test_gates VALUES ($1)", wid)


async def _killed_mid_chain(settings: Settings) -> str:
    """A run whose worker was SIGKILLed in the middle of a chain (at phase 3); its id."""
    wid = await _start(settings)
    dying = spawn_worker(settings, modules=MODULES,
                         extra_env={"PHASEGATE_FAULTS": "mid_chain@3"})
    try:
        assert await asyncio.to_thread(dying.wait, 60) == -9
    finally:
        stop_process(dying)
    return wid


async def _drained(worker) -> bool:
    depth = await worker.queue.depth()
    return depth.visible == 0 and depth.inflight == 0 and worker.held == 0


async def test_a_chain_runs_locally_with_a_fraction_of_the_sqs_calls(settings):
    """Twelve phases: with continuation one message is received and deleted and nothing is
    sent; without it each phase costs a send, a receive and a delete."""
    counts = {}
    for mode in (True, False):
        wid = await _start(settings)
        async with running_worker(settings.model_copy(update={"continuation": mode}),
                                  REGISTRY) as worker:
            await wait_for(lambda wid=wid: all_done(settings.database_url, [wid]), what="done")
            await wait_for(lambda worker=worker: _drained(worker), what="queue drained")
            counts[mode] = dict(worker.queue.counts)
        rows = await fetch(settings.database_url, "SELECT seq, count(*) AS n FROM checkpoints "
                           "WHERE workflow_id = $1 GROUP BY seq ORDER BY seq", wid)
        assert [(r["seq"], r["n"]) for r in rows] == [(i, 1) for i in range(len(PHASES))]
        await fetch(settings.database_url, "DELETE FROM test_invocations")
    on, off = counts[True], counts[False]
    assert on.get("send", 0) == 0 and on["delete"] == 1
    assert off["send"] == len(PHASES) - 1 and off["delete"] == len(PHASES)
    # Every successor row is accounted for: sent (a continued hop writes none).
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0


async def test_chain_is_bounded_then_handed_to_the_queue(settings):
    wid = await _start(settings)
    bounded = settings.model_copy(update={"continuation_max_hops": 4})
    async with running_worker(bounded, REGISTRY) as worker:
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="done")
        await wait_for(lambda: _drained(worker), what="queue drained")
        counts = worker.queue.counts
    # 12 phases, 5 per received message (the first + 4 continued): 3 messages, 2 sends.
    assert counts["send"] == 2 and counts["delete"] == 3
    assert await _invocations(settings) == len(PHASES)


async def test_sigkill_mid_chain_resumes_through_sqs_after_the_lease(settings):
    """The worker dies with the run's next hop held by its chain lease (no outbox row) and the
    received message in flight: nobody sends the next message until the lease runs out, then
    it is rebuilt from the run and sent (by the relay, or by the worker that gets the dead
    worker's message back), and another worker finishes the run with every phase run and
    committed once."""
    wid = await _killed_mid_chain(settings)
    assert await _chain(settings) == (3, True)
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM outbox WHERE seq = 3") == 0
    async with running_relay(settings, settings.relay_interval_s), \
            running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run resumed")
    await _committed_once(settings)
    assert await fetchval(settings.database_url, "SELECT count(*) FROM outbox "
                          "WHERE seq = 3 AND sent_at IS NOT NULL") == 1
    assert await _invocations(settings) == len(PHASES)


async def test_sigkill_mid_chain_resumes_with_workers_alone(settings):
    """No relay running: the dead worker's received message comes back to another worker,
    which finds the run held by a chain lease, holds the message back until the lease has run
    out, then rebuilds the next message and sends it itself -- the chain resumes although
    nobody relays."""
    wid = await _killed_mid_chain(settings)
    assert await _chain(settings) == (3, True)
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=90,
                       what="run resumed by a worker alone")
    await _committed_once(settings)
    assert await _invocations(settings) == len(PHASES)


async def test_a_long_phase_keeps_its_lease_and_a_stopped_heartbeat_loses_it(settings):
    """While a continued phase runs longer than the lease, the heartbeat keeps extending the
    run's chain lease and the relay (running) sends nothing. Then the worker is frozen
    (SIGSTOP: no heartbeat): the lease runs out and the next message is rebuilt and sent — by
    the relay, or by the worker that receives the frozen chain's message again (the
    duplicate path rescues an expired chain itself), whichever comes first —, another worker
    runs the phase and commits; the frozen worker, thawed, finishes the same phase and its
    commit is superseded, never applied twice."""
    wid = await _start(settings, gate="p03")
    frozen = spawn_worker(settings, modules=MODULES)
    try:
        async with running_relay(settings, settings.relay_interval_s) as relay:
            await wait_for(lambda: _invocations(settings, "p03"), what="p03 running")
            committed = await fetchval(settings.database_url,
                                       "SELECT updated_at FROM run_positions")
            extended = timedelta(seconds=settings.visibility_timeout_s + 1)

            async def extended_by_heartbeat() -> bool:
                return bool(await fetchval(
                    settings.database_url, "SELECT chain_until > $1::timestamptz + $2::interval "
                    "FROM run_positions WHERE next_seq = 3", committed, extended))

            await wait_for(extended_by_heartbeat, what="the heartbeat extends the lease")
            assert await fetchval(settings.database_url,
                                  "SELECT count(*) FROM outbox WHERE seq = 3") == 0
            assert relay.relayed == 0

            os.kill(frozen.pid, signal.SIGSTOP)
            await _open_gate(settings, wid)
            async with running_worker(settings, REGISTRY):
                await wait_for(lambda: all_done(settings.database_url, [wid]),
                               what="another worker finished the run")
            # Sent once the lease had run out (the heartbeat had kept it live before).
            assert await fetchval(settings.database_url,
                                  "SELECT sent_at IS NOT NULL FROM outbox WHERE seq = 3")
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        assert stop_process(frozen) == 0
    await _committed_once(settings)
    assert await _invocations(settings, "p03") == 2  # run twice, committed once


async def test_sigterm_mid_chain_exits_0_and_the_run_completes_elsewhere(settings):
    """SIGTERM while a continued phase runs past the grace: the phase is cancelled, its
    message is written and sent on the way out (the chain lease ended), the worker exits 0
    and another finishes the run."""
    wid = await _start(settings, gate="p05")
    stopping = spawn_worker(settings.model_copy(update={"shutdown_grace_s": 1.0}),
                            modules=MODULES)
    try:
        await wait_for(lambda: _invocations(settings, "p05"), what="p05 running")
        stopping.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(stopping.wait, 30) == 0
    finally:
        stop_process(stopping)
    # Handed off at once: the row is sent, not left to run out its lease.
    assert await fetchval(settings.database_url, "SELECT sent_at IS NOT NULL FROM outbox "
                          "WHERE seq = 5")
    assert await _chain(settings) == (5, None)
    await _open_gate(settings, wid)
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    await _committed_once(settings)


async def test_a_commit_in_flight_when_the_grace_ends_lands_and_hands_off(settings):
    """The stop's grace ends while a continued hop's commit waits (on a run-row lock another
    session holds): the transition is not cancelled under its commit. The commit lands, the
    chain's next message is sent at once, the received message is settled and the worker
    stops; another worker finishes the run."""
    wid = await _start(settings, gate="p05")
    worker = Worker(settings=settings.model_copy(update={"shutdown_grace_s": 0.2}),
                    registry=REGISTRY)
    with capture_logs() as logs:
        running = asyncio.create_task(worker.run())
        try:
            await wait_for(lambda: _invocations(settings, "p05"), what="p05 running")
            locker = await asyncpg.connect(settings.database_url)
            try:
                locking = locker.transaction()
                await locking.start()
                await locker.execute("SELECT 1 FROM workflow_runs WHERE workflow_id = $1 "
                                     "FOR UPDATE", wid)
                await _open_gate(settings, wid)
                await wait_for(lambda: _commit_waits_on_a_lock(settings),
                               what="p05's commit waiting on the lock")
                worker.stop()
                await wait_for(lambda: _logged(logs, "grace_expired_handing_back"),
                               what="the grace ended")
                await locking.commit()
            finally:
                await locker.close()
            await asyncio.wait_for(running, timeout=30)
        finally:
            worker.stop()
    (expired,) = [e for e in logs if e["event"] == "grace_expired_handing_back"]
    assert (expired["phases"], expired["committing"]) == (0, 1)
    assert not [e for e in logs if e["event"] == "durable_abandoned_at_stop"]
    # p05 committed and its successor went out at once: no chain lease left to run out.
    assert await _chain(settings) == (6, None)
    assert await fetchval(settings.database_url, "SELECT sent_at IS NOT NULL FROM outbox "
                          "WHERE seq = 6")
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    await _committed_once(settings)
    assert await _invocations(settings, "p05") == 1


async def _logged(logs: list[dict[str, object]], event: str) -> bool:
    return any(entry["event"] == event for entry in logs)


async def _commit_waits_on_a_lock(settings: Settings) -> bool:
    return bool(await fetchval(
        settings.database_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type "
        "= 'Lock' AND query LIKE '%continue_phase%'"))


async def test_cancel_during_a_chain_stops_it_at_the_next_commit(settings):
    wid = await _start(settings, gate="p04")
    async with running_worker(settings, REGISTRY) as worker, \
            store_for(settings.database_url) as store:
        await wait_for(lambda: _invocations(settings, "p04"), what="p04 running")
        await Control(store.pool, None, REGISTRY, actor="test").cancel(wid, "enough")
        await _open_gate(settings, wid)
        await wait_for(lambda: _drained(worker), what="the chain ended")
        assert await store.pool.fetchval("SELECT status FROM workflow_runs") == "cancelled"
    # p04's commit was refused (the run was no longer running); nothing after it ran, and no
    # message was written for the cancelled run (the cancel ended its chain lease).
    assert await fetchval(settings.database_url, "SELECT max(seq) FROM checkpoints") == 3
    assert await _invocations(settings, "p05") == 0
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM outbox WHERE seq >= 4") == 0
    assert await fetchval(settings.database_url, "SELECT count(*) FROM run_positions") == 0


async def _chain(settings: Settings) -> tuple[int, bool | None]:
    """The run's next seq (its run row's: a live chain's position may be a heartbeat behind,
    migration 0030), and whether a chain lease holds it and is live (None: no chain)."""
    row = (await fetch(settings.database_url,
                       "SELECT r.next_seq, CASE WHEN p.chain_holder IS NOT NULL "
                       "THEN p.chain_until > now() END AS live "
                       "FROM run_positions p JOIN workflow_runs r USING (workflow_id)"))[0]
    return row["next_seq"], row["live"]


async def test_a_continued_phase_sees_the_context_a_phase_from_sqs_sees(settings):
    """Every field of ``ctx`` a phase reads is the same whether the phase ran in its
    predecessor's chain or from its message through SQS (the seq's own progress and signal
    stay with that seq)."""
    registry = Registry([workflows_chain.context_views])
    views = {}
    for continuation in (True, False):
        run_settings = settings.model_copy(update={"continuation": continuation})
        continued = METRICS.get_sample_value("phasegate_continued_hops_total") or 0.0
        async with store_for(settings.database_url) as store, queue_for(settings) as queue:
            wid = (await start_workflow(store, queue, workflow=workflows_chain.context_views,
                                        input={})).workflow_id
        async with running_worker(run_settings, registry):
            await wait_for(lambda wid=wid: all_done(settings.database_url, [wid]),
                           what="run completed")
        hops = (METRICS.get_sample_value("phasegate_continued_hops_total") or 0.0) - continued
        assert hops == (len(workflows_chain.CONTEXT_PHASES) - 1 if continuation else 0)
        state = await fetchval(settings.database_url, "SELECT state::text FROM checkpoints "
                               "WHERE workflow_id = $1 AND seq = $2", wid,
                               len(workflows_chain.CONTEXT_PHASES) - 1)
        views[continuation] = json.loads(state)["views"]
    assert views[True] == views[False]
    assert [v["phase"] for v in views[True]] == list(workflows_chain.CONTEXT_PHASES)
    assert all(v["resumed_progress"] is None and v["attempt"] == 1 for v in views[True])


def test_settings_default_to_continuation_on(database_url, queue_pair, sqs_endpoint):
    made = make_settings(database_url, queue_pair, sqs_endpoint)
    assert made.continuation is True and made.continuation_max_hops == 16
