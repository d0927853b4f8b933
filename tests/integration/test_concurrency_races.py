"""Per-key concurrency against real Postgres: admissions decided in the transaction that
frees or takes a slot, never lost, never doubled.

The overlaps are forced, not hoped for (as in test_branches_concurrency.py): a third
connection holds the key's advisory lock while two finishing commits (or a start and a
finish) begin; once Postgres shows both waiting on it, the lock is released and they race.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from phasegate import concurrency
from phasegate.envelope import canonical_json, start_message, state_hash
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.relay import Relay
from phasegate.store import PhaseCommit, Store
from phasegate.workflow import Workflow
from tests.helpers import fetch, fetchval, queue_for, store_for, wait_for
from tests.integration.test_group_commit import (
    behind_a_held_head,
    commit_of,
    grouped_store,
    running,
)
from tests.workflows_flow import limited, single

ROUNDS = 2


def final_commit(workflow_id: str, phase: str) -> PhaseCommit:
    """The commit of a run's last phase at seq 0: the run completes and frees its slot."""
    canonical = canonical_json({"done": True})
    return PhaseCommit(workflow_id=workflow_id, branch="main", seq=0, phase=phase,
                       schema_version=1, state_json=canonical, state_hash=state_hash(canonical),
                       next_phase=None, status="completed", worker_id="test")


async def start(store: Store, workflow: Workflow, workflow_id: str, tenant: str = "t") -> str:
    """What a worker does with the start message: the run, then its slot or its place."""
    envelope = start_message(workflow_id, workflow.name, {"tenant": tenant})
    taken = await concurrency.start(store, envelope, workflow)
    assert not isinstance(taken, concurrency.Refused)
    status, position = taken
    # Admitted: loaded by the same statement (pending -> running); queued: not loaded.
    assert (position is not None and position.status == "running") == (status == "pending"), \
        (status, position)
    return status


async def statuses(database_url: str, ids: list[str]) -> list[str]:
    rows = await fetch(database_url, "SELECT workflow_id, status FROM workflow_runs "
                       "WHERE workflow_id = ANY($1)", ids)
    by_id = {r["workflow_id"]: r["status"] for r in rows}
    return [by_id[i] for i in ids]


async def admission_rows(database_url: str, workflow_id: str) -> int:
    return int(await fetchval(database_url, "SELECT count(*) FROM outbox WHERE workflow_id = $1"
                              " AND dedup_id = $2", workflow_id,
                              concurrency.admission_dedup_id(workflow_id)))


async def holders(database_url: str, workflow: str, key: str = "t") -> int:
    return int(await fetchval(
        database_url, "SELECT count(*) FROM workflow_runs WHERE workflow = $1 AND "
        "concurrency_key = $2 AND status NOT IN ('queued', 'completed', 'failed', 'cancelled')",
        workflow, key))


async def held(database_url: str, workflow: str, key: str, *racers: asyncio.Future[object]
               ) -> list[object]:
    """Run ``racers`` while the key's lock is held; release once both wait on it."""
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("SELECT pg_advisory_lock(phasegate_slot_lock($1, $2))",
                             workflow, key)
        gathered = asyncio.gather(*racers)
        await wait_for(lambda: _waiting(database_url, len(racers)), timeout=30,
                       what="both transactions waiting on the key's lock")
        await holder.execute("SELECT pg_advisory_unlock(phasegate_slot_lock($1, $2))",
                             workflow, key)
        return list(await gathered)
    finally:
        await holder.close()


async def _waiting(database_url: str, n: int) -> bool:
    count = await fetchval(database_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                           "datname = current_database() AND wait_event_type = 'Lock'")
    return int(count) == n


async def test_starts_beyond_the_limit_queue_in_order(database_url):
    async with store_for(database_url) as store:
        ids = [f"wf_order_{i}" for i in range(5)]
        assert [await start(store, limited, i) for i in ids] == \
            ["pending"] * 2 + ["queued"] * 3
        # Redelivered starts change nothing: the decision is made once.
        assert await start(store, limited, ids[4]) == "queued"
        # The run list (API and CLI) shows them by status.
        views = Control(store.pool, None, None, actor="test").views
        page = await views.list_runs(status="queued")
        assert sorted(r.workflow_id for r in page.runs) == ids[2:]
        assert await store.commit_phase(final_commit(ids[0], "begin")) is not None
        assert await statuses(database_url, ids) == \
            ["completed", "running", "pending", "queued", "queued"]
        rows = await concurrency.admitted_by(store, ids[0])
        assert [json.loads(r.body)["workflow_id"] for r in rows] == [ids[2]]
        assert json.loads(rows[0].body).get("input") is None  # the row holds it


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_two_finishes_racing_for_one_queued_run_admit_it_once(database_url, round_):
    async with store_for(database_url) as first, store_for(database_url) as second:
        a, b, q = (f"wf_one_{round_}_{n}" for n in "abq")
        for run in (a, b):
            assert await start(first, limited, run) == "pending"
        assert await start(first, limited, q) == "queued"
        results = await held(database_url, "limited", "t",
                             first.commit_phase(final_commit(a, "begin")),
                             second.commit_phase(final_commit(b, "begin")))
    assert all(r is not None for r in results)
    assert await statuses(database_url, [a, b, q]) == ["completed", "completed", "pending"]
    assert await admission_rows(database_url, q) == 1
    assert await holders(database_url, "limited") == 1


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_two_finishes_racing_admit_two_queued_runs(database_url, round_):
    """Two slots free at once and two runs wait: both are admitted (none lost), no third."""
    async with store_for(database_url) as first, store_for(database_url) as second:
        a, b, q1, q2, q3 = (f"wf_two_{round_}_{n}" for n in ("a", "b", "q1", "q2", "q3"))
        for run in (a, b):
            assert await start(first, limited, run) == "pending"
        for run in (q1, q2, q3):
            assert await start(first, limited, run) == "queued"
        await held(database_url, "limited", "t",
                   first.commit_phase(final_commit(a, "begin")),
                   second.commit_phase(final_commit(b, "begin")))
    assert await statuses(database_url, [q1, q2, q3]) == ["pending", "pending", "queued"]
    assert [await admission_rows(database_url, r) for r in (q1, q2, q3)] == [1, 1, 0]
    assert await holders(database_url, "limited") == 2


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_a_start_racing_a_finish_is_admitted_once(database_url, round_):
    """max_concurrency=1: whichever goes first, the new run ends up holding the one slot."""
    async with store_for(database_url) as first, store_for(database_url) as second:
        a, s = f"wf_sf_{round_}_a", f"wf_sf_{round_}_s"
        assert await start(first, single, a) == "pending"
        # The start's run row exists before the race (the API made it); its decision races.
        await second.start_run(workflow_id=s, workflow="single", schema_version=1,
                               input={"tenant": "t"}, first_phase="only",
                               message=start_message(s, "single", None))
        results = await held(
            database_url, "single", "t", first.commit_phase(final_commit(a, "only")),
            concurrency.start(second, start_message(s, "single", None), single))
    decided, _ = results[1]
    assert decided in ("pending", "queued")
    # Admitted at its start: loaded by the same statement (running). Queued first: admitted
    # by the finish (pending), with its own start message; else none needed.
    assert await statuses(database_url, [a, s]) == [
        "completed", "running" if decided == "pending" else "pending"]
    assert await admission_rows(database_url, s) == (1 if decided == "queued" else 0)
    assert await holders(database_url, "single") == 1


async def test_gathered_finishes_without_a_hold_never_exceed_the_limit(database_url):
    async with store_for(database_url) as first, store_for(database_url) as second:
        ids = [f"wf_free_{i}" for i in range(8)]
        for run in ids:
            await start(first, limited, run)
        running = ids[:2]
        while running:
            # Finish every running run at once; whatever they admit runs next.
            await asyncio.gather(*(store.commit_phase(final_commit(run, "begin")) for
                                   store, run in zip((first, second), running, strict=False)))
            assert await holders(database_url, "limited") <= 2
            now = await statuses(database_url, ids)
            running = [r for r, st in zip(ids, now, strict=True) if st == "pending"]
            for run in running:
                assert await first.load_for_phase(run) is not None
    assert await statuses(database_url, ids) == ["completed"] * 8


async def test_cancel_of_a_queued_run_and_of_a_running_run(settings):
    database_url = settings.database_url
    async with store_for(database_url) as store, queue_for(settings) as queue:
        control = Control(store.pool, None, None, actor="test")
        a, b, q1, q2 = "wf_c_a", "wf_c_b", "wf_c_q1", "wf_c_q2"
        for run in (a, b, q1, q2):
            await start(store, limited, run)
        # A queued run cancelled: it leaves the queue and takes no slot.
        assert (await control.cancel(q1)).run.status == "cancelled"
        assert await statuses(database_url, [q2]) == ["queued"]
        # A running run cancelled: its slot goes to the next queued run (q2, not q1).
        assert (await control.cancel(a)).run.status == "cancelled"
        assert await statuses(database_url, [a, b, q1, q2]) == \
            ["cancelled", "running", "cancelled", "pending"]
        assert await admission_rows(database_url, q2) == 1
        assert await admission_rows(database_url, q1) == 0
        # The relay sends the admission (no worker ended a run here).
        assert await fetchval(database_url, "SELECT count(*) FROM outbox WHERE workflow_id = $1"
                              " AND sent_at IS NULL", q2) == 1
        assert await Relay(store=store, queue=queue, after_s=0).relay_once() == 1
        [message] = await queue.receive(10, 0, 30)
        assert (json.loads(message.body)["workflow_id"], json.loads(message.body)["kind"]) == \
            (q2, "start")


async def test_a_failed_run_frees_its_slot(database_url):
    async with store_for(database_url) as store:
        a, b, q = "wf_f_a", "wf_f_b", "wf_f_q"
        for run in (a, b, q):
            await start(store, limited, run)
        assert await store.record_failure(a, 0, "Boom", max_attempts=1) == (1, "failed")
        assert await statuses(database_url, [a, q]) == ["failed", "pending"]
        assert [json.loads(r.body)["workflow_id"]
                for r in await concurrency.admitted_by(store, a)] == [q]


async def test_a_plain_workflows_runs_have_no_key_and_wake_nothing(database_url):
    """A workflow without a key: no key on its runs, so the slot trigger never fires."""
    async with store_for(database_url) as store:
        await store.start_run(workflow_id="wf_plain", workflow="plain", schema_version=1,
                              input={"tenant": "t"}, first_phase="only",
                              message=start_message("wf_plain", "plain", None))
        assert await store.load_for_phase("wf_plain") is not None
        assert await store.commit_phase(final_commit("wf_plain", "only")) is not None
        row = (await fetch(database_url, "SELECT concurrency_key, status FROM workflow_runs "
                           "WHERE workflow_id = 'wf_plain'"))[0]
        assert tuple(row) == (None, "completed")
        assert await fetchval(database_url, "SELECT count(*) FROM run_admissions") == 0


POSITIONS_OF_LIVE_RUNS = """
SELECT r.workflow_id, r.status AS run, p.status AS position
  FROM workflow_runs r LEFT JOIN run_positions p USING (workflow_id)
 WHERE r.workflow_id = ANY($1) ORDER BY r.workflow_id
"""


@pytest.mark.parametrize("path", ["commit", "grouped", "failure"])
async def test_an_admitted_runs_position_follows_its_admission(database_url, path):
    """The runs a freed slot admits show `pending` in their positions too (what the stall
    report and the relay's rescue of a lost message read), whichever statement frees the
    slot. The final commit writes its own run's position and stands the position trigger
    down for its statement; the admissions its slot trigger made inside that statement were
    left `queued` there (chaos seed 74 with --keyed 2: an admission message lost, the run
    stranded `pending`, never rescued)."""
    async with store_for(database_url) as store, \
            grouped_store(database_url) as grouped:
        ids = [f"wf_pos_{path}_{n}" for n in ("a", "b", "q1", "q2")]
        assert [await start(store, limited, i) for i in ids] == ["pending"] * 2 + ["queued"] * 2
        if path == "commit":
            for run in ids[:2]:
                assert await store.commit_phase(final_commit(run, "begin")) is not None
        elif path == "grouped":  # both final commits rows of one commit_phases statement
            await running(grouped, "wf_pos_head")
            _, results = await behind_a_held_head(
                database_url, grouped, (commit_of("wf_pos_head"), None),
                [(final_commit(run, "begin"), None) for run in ids[:2]])
            assert all(r is not None and not isinstance(r, BaseException) for r in results)
            assert grouped.group_commit is not None and grouped.group_commit.statements == 1
        else:
            for run in ids[:2]:
                assert await store.record_failure(run, 0, "Boom", max_attempts=1) == \
                    (1, "failed")
    rows = await fetch(database_url, POSITIONS_OF_LIVE_RUNS, ids[2:])
    assert [tuple(r) for r in rows] == [(i, "pending", "pending") for i in ids[2:]]


async def test_an_admission_lost_after_a_final_commit_is_sent_again(settings):
    """The consequence the position decides: the relay's stall rescue reads run_positions, so
    the start message of a run admitted by another run's final commit, once SQS lost it, is
    sent again (under a new deduplication id) instead of leaving the run `pending` for good."""
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        a, b, q = "wf_lost_a", "wf_lost_b", "wf_lost_q"
        assert [await start(store, limited, i) for i in (a, b, q)] == \
            ["pending", "pending", "queued"]
        assert await store.commit_phase(final_commit(a, "begin")) is not None
        # Stalled at once; the relay's own claim on the row it sent (30 s) still live, and
        # cleared by the requeue, so the same relay's next round sends it.
        relay = Relay(store=store, queue=queue, after_s=0, stall_after_s=0)
        assert await relay.relay_once() == 1  # the admission, sent
        [lost] = await queue.receive(10, 0, 30)
        await queue.delete([lost.receipt_handle])  # gone unprocessed: what a lost message is
        assert json.loads(lost.body)["workflow_id"] == q
        assert await relay.requeue_stalled() == 1
        assert await relay.relay_once() == 1
        [again] = await queue.receive(10, 0, 30)
        assert (json.loads(again.body)["workflow_id"], json.loads(again.body)["kind"]) == \
            (q, "start")
