"""Leased send (worker/continuation.py): a plain successor that goes through SQS is committed
as a lease on the run's position, not an outbox row, against real PostgreSQL, a real SQS
server and real workers. What the user sees: the same runs completed exactly once, fewer
rows; a lease that runs out (a phase longer than it) becomes the outbox row a plain advance
would have left; a duplicate never waits for the lease in front of the successor."""

from __future__ import annotations

from prometheus_client import REGISTRY as METRICS

from phasegate.envelope import phase_message, state_hash
from phasegate.orchestrator.starter import start_workflow
from phasegate.settings import Settings
from phasegate.sql import queries
from phasegate.store import Lease, PhaseCommit
from phasegate.worker.duplicates import Duplicates
from phasegate.workflow import Registry
from tests import workflows_chain
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    queue_for,
    running_relay,
    running_worker,
    store_for,
    wait_for,
)
from tests.workflows_chain import PHASES

REGISTRY = Registry([workflows_chain.hops])


def _sent_only(settings: Settings) -> Settings:
    """Every successor through SQS (continuation off), leased."""
    return settings.model_copy(update={"continuation": False, "leased_send": True})


async def _start(settings: Settings, gate: str | None = None) -> str:
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        started = await start_workflow(store, queue, workflow=workflows_chain.hops,
                                       input={"gate": gate} if gate else {})
    return started.workflow_id


async def _each_phase_once(settings: Settings, wid: str) -> None:
    rows = await fetch(settings.database_url, "SELECT seq, count(*) AS n FROM checkpoints "
                       "WHERE workflow_id = $1 AND kind = 'phase' GROUP BY seq ORDER BY seq",
                       wid)
    assert [(r["seq"], r["n"]) for r in rows] == [(i, 1) for i in range(len(PHASES))]
    ran = await fetch(settings.database_url, "SELECT phase, count(*) AS n "
                      "FROM test_invocations WHERE workflow_id = $1 GROUP BY phase", wid)
    assert {r["phase"]: r["n"] for r in ran} == dict.fromkeys(PHASES, 1)


def _lapsed() -> float:
    return METRICS.get_sample_value("phasegate_sent_leases_lapsed_total") or 0.0


async def test_successors_go_out_without_outbox_rows(settings):
    """Twelve phases through SQS: eleven sends, and the only outbox row is the start
    message's; with leased sends off, a row per successor, each marked sent."""
    rows = {}
    for leased in (True, False):
        wid = await _start(settings)
        mode = _sent_only(settings).model_copy(update={"leased_send": leased})
        async with running_worker(mode, REGISTRY) as worker:
            await wait_for(lambda wid=wid: all_done(settings.database_url, [wid]), what="done")
            sends = worker.queue.counts["send"]
        await _each_phase_once(settings, wid)
        assert sends == len(PHASES) - 1
        rows[leased] = await fetch(settings.database_url, "SELECT seq, sent_at FROM outbox "
                                   "WHERE workflow_id = $1 ORDER BY seq", wid)
    assert [r["seq"] for r in rows[True]] == [0]
    assert [r["seq"] for r in rows[False]] == list(range(len(PHASES)))
    assert all(r["sent_at"] is not None for r in rows[True] + rows[False])
    # A finished run keeps no position, lease or not.
    assert await fetchval(settings.database_url, "SELECT count(*) FROM run_positions") == 0


async def test_a_lease_that_runs_out_before_its_phase_ends_becomes_a_sent_row(settings):
    """p03 waits at a gate for longer than the lease (the visibility timeout, 3 s here): the
    relay writes p03's message as an outbox row, marked sent (SQS drops it as a duplicate
    of the worker's send), and clears the lease. The run then ends with every phase once."""
    settings = _sent_only(settings)
    wid = await _start(settings, gate="p03")
    before = _lapsed()
    async with running_worker(settings, REGISTRY), running_relay(settings):
        await wait_for(lambda: _invoked(settings, wid, "p03"), what="p03 running")
        holder = await fetchval(settings.database_url, "SELECT chain_holder FROM "
                                "run_positions WHERE workflow_id = $1", wid)
        assert holder is not None and holder.endswith("/sent")
        assert await fetchval(settings.database_url, "SELECT count(*) FROM outbox "
                              "WHERE workflow_id = $1 AND seq = 3", wid) == 0
        # The status summary counts p03's message as uncommitted although it has no row.
        ages = await fetch(settings.database_url, queries("control.sql")["message_ages"])
        assert ages[0]["uncommitted"] == 1 and ages[0]["uncommitted_s"] >= 0

        async def written() -> bool:
            return bool(await fetchval(
                settings.database_url, "SELECT count(*) FROM outbox WHERE workflow_id = $1 "
                "AND seq = 3 AND sent_at IS NOT NULL", wid))

        await wait_for(written, what="the lapsed lease's message written and sent")
        assert await fetchval(settings.database_url, "SELECT chain_holder FROM run_positions "
                              "WHERE workflow_id = $1", wid) is None
        await fetch(settings.database_url, "INSERT INTO test_gates VALUES ($1)", wid)
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="done")
    await _each_phase_once(settings, wid)
    assert _lapsed() == before + 1


async def _invoked(settings: Settings, wid: str, phase: str) -> bool:
    return bool(await fetchval(settings.database_url, "SELECT count(*) FROM test_invocations "
                               "WHERE workflow_id = $1 AND phase = $2", wid, phase))


async def test_a_duplicate_ends_a_live_lease_instead_of_waiting_for_it(settings):
    """Phase p00 committed under a leased send whose message never went out (its worker died
    before the send), the lease ten minutes long, and p00's message delivered again. The
    duplicate finds the lease, ends it as its holder would, sends p01's message and is
    deleted: the run completes long before the lease would have run out (held back, the
    duplicate would have stood in front of p01 in the group until then)."""
    settings = _sent_only(settings)
    wid = await _start(settings)
    async with store_for(settings.database_url) as store:
        position = await store.load_for_phase(wid)
        assert position is not None and position.next_seq == 0
        successor = phase_message(wid, "hops", 1, PHASES[1])
        committed = await store.commit_phase(PhaseCommit(
            workflow_id=wid, branch="main", seq=0, phase=PHASES[0], schema_version=1,
            state_json='{"n":1}', state_hash=state_hash('{"n":1}'), next_phase=PHASES[1],
            status="running", worker_id="gone", successor=successor),
            lease=Lease("gone/sent", 600.0))
        assert committed is not None and committed[1] is None  # a lease, no outbox row
    # The start message is still in the queue (p00's, never received): it is the duplicate.
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="done")
    row = await fetch(settings.database_url, "SELECT sent_at FROM outbox WHERE "
                      "workflow_id = $1 AND seq = 1", wid)
    assert len(row) == 1 and row[0]["sent_at"] is not None
    assert await fetchval(settings.database_url, "SELECT count(*) FROM test_invocations "
                          "WHERE workflow_id = $1 AND phase = $2", wid, PHASES[0]) == 0
    assert await fetchval(settings.database_url, "SELECT count(*) FROM test_invocations "
                          "WHERE workflow_id = $1", wid) == len(PHASES) - 1


async def test_a_chain_lease_still_holds_a_duplicate_back(settings):
    """The same duplicate in front of a live chain lease (no ``/sent``: a worker runs the
    phase itself) is held back, not resolved: the chain's worker owns the next message."""
    settings = _sent_only(settings)
    wid = await _start(settings)
    async with store_for(settings.database_url) as store:
        assert await store.load_for_phase(wid) is not None  # claims the run: running
        assert await store.chain_of(wid, 1) is None
        successor = phase_message(wid, "hops", 1, PHASES[1])
        await store.commit_phase(PhaseCommit(
            workflow_id=wid, branch="main", seq=0, phase=PHASES[0], schema_version=1,
            state_json='{"n":1}', state_hash=state_hash('{"n":1}'), next_phase=PHASES[1],
            status="running", worker_id="alive", successor=successor),
            lease=Lease("alive", 600.0))
        chain = await store.chain_of(wid, 1)
        assert chain is not None and chain.live and not chain.sent
        async def no_emit(row: object) -> bool:
            raise AssertionError("a live chain's message is its worker's to send")

        duplicates = Duplicates(store=store, emit=no_emit, lease_s=600.0)
        assert await duplicates.ensure_successor(phase_message(wid, "hops", 0, PHASES[0]), 1) \
            is False
    assert await fetchval(settings.database_url, "SELECT count(*) FROM outbox WHERE "
                          "workflow_id = $1 AND seq = 1", wid) == 0
