"""A race's deadline against real Postgres, SQS (moto over HTTP), the relay and real worker
processes: a race with no winner by its deadline fails the run with RaceDeadlineExceeded and
discards its branches; a race won before it completes and the late deadline message changes
nothing; the deadline fires while no worker runs (the relay sends it when due, a worker
started afterwards ends the race)."""

from __future__ import annotations

import json
import signal
from typing import Any

from prometheus_client import REGISTRY as REGISTRY_METRICS

from phasegate.orchestrator.control import Control
from phasegate.orchestrator.exporter import QueueDepthExporter
from phasegate.orchestrator.views import Views
from phasegate.settings import Settings
from phasegate.workflow import Registry
from tests.branch_helpers import (  # noqa: F401 (fixtures)
    count,
    discarded_checkpoints,
    inspect,
    inspect_tree,
    main_state,
    open_gates,
    settings_fixture,
    start,
)
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    queue_for,
    running_relay,
    running_worker,
    spawn_worker,
    stop_process,
    store_for,
    wait_for,
)
from tests.workflows_branch_doors import drafts, timed_race

MODULES = "tests.workflows_branch_doors"
REGISTRY = Registry([timed_race, drafts])


def searching(settings: Settings, n: int) -> Any:
    async def check() -> bool:
        return await count(settings, "SELECT count(*) FROM test_invocations "
                           "WHERE phase = 'search'") >= n
    return check


async def deadline_row(settings: Settings, wid: str) -> Any:
    rows = await fetch(settings.database_url or "",
                       "SELECT o.branch, o.seq, o.due_at, o.sent_at, o.body, f.deadline_at, "
                       "extract(epoch FROM f.deadline_at - f.created_at)::float8 AS after_s "
                       "FROM outbox o JOIN forks f USING (workflow_id) WHERE o.workflow_id = $1 "
                       "AND o.body LIKE '%\"kind\":\"deadline\"%'", wid)
    assert len(rows) == 1
    return rows[0]


def deadline_sent(settings: Settings, wid: str) -> Any:
    async def check() -> bool:
        return (await deadline_row(settings, wid))["sent_at"] is not None
    return check


async def assert_ended_by_deadline(settings: Settings, wid: str, n: int) -> None:
    run = (await fetch(settings.database_url or "", "SELECT status, error FROM workflow_runs "
                       "WHERE workflow_id = $1", wid))[0]
    assert run["status"] == "failed"
    assert run["error"] == ("RaceDeadlineExceeded: no branch of the race at main seq 0 won "
                            "within its deadline of 3 s")
    fork = (await fetch(settings.database_url or "", "SELECT status, resolution, winner, "
                        "pending FROM forks WHERE workflow_id = $1", wid))[0]
    assert tuple(fork) == ("failed", "deadline", None, 0)
    statuses = await fetch(settings.database_url or "", "SELECT status FROM branches "
                           "WHERE workflow_id = $1", wid)
    assert [r["status"] for r in statuses] == ["discarded"] * n
    assert await count(settings, "SELECT count(*) FROM test_invocations WHERE phase = "
                       "'settle'") == 0
    assert await count(settings, "SELECT count(*) FROM checkpoints WHERE workflow_id = $1 "
                       "AND branch <> 'main' AND kind = 'phase'", wid) == 0
    row = await deadline_row(settings, wid)
    # Due exactly 3 s after the fork, both in database time; never sent before it was due.
    assert (row["branch"], row["seq"], row["after_s"]) == ("main", 1, 3.0)
    assert row["due_at"] == row["deadline_at"] and row["sent_at"] >= row["due_at"]
    body = json.loads(row["body"])
    assert (body["kind"], body["seq"], body["phase"], body["branch"]) == (
        "deadline", 0, "settle", "main")


async def test_no_winner_by_the_deadline_fails_the_run_and_discards_the_branches(settings):
    """Three branches held inside `search` (a slow phase) past a 3 s deadline, one worker
    process running throughout: the race ends, the run fails with the deadline error, every
    branch is discarded; once released, their phases' results are recorded as discarded."""
    wid = await start(settings, timed_race, {"n": 3, "gate": "slow", "deadline_s": 3})
    worker = spawn_worker(settings, modules=MODULES)
    try:
        async with running_relay(settings):
            await wait_for(searching(settings, 3), what="three branches in search")
            await wait_for(lambda: all_done(settings.database_url or "", [wid], "failed"),
                           timeout=60, what="the race ended by its deadline")
        await assert_ended_by_deadline(settings, wid, 3)
        await open_gates(settings, "slow", 3)
        await wait_for(discarded_checkpoints(settings, wid, 3), what="late results discarded")
    finally:
        assert stop_process(worker) == 0
    assert await count(settings, "SELECT count(*) FROM checkpoints WHERE workflow_id = $1 "
                       "AND kind = 'phase' AND branch <> 'main'", wid) == 0
    lines = await inspect_tree(settings, MODULES, wid)
    print("\n".join(lines))  # the report quotes this tree
    assert lines == [
        f"{wid}  timed-race  failed",
        "└── * 0 launch  fork race -> settle: deadline (3/3 done)",
        "    ├── f0.s0  discarded  x1 search",
        "    ├── f0.s1  discarded  x1 search",
        "    └── f0.s2  discarded  x1 search",
    ]


async def test_a_race_won_before_its_deadline_completes_and_the_deadline_is_a_no_op(settings):
    """s1 wins at once; when the deadline message comes due 5 s after the fork, the relay
    sends it and the worker finds the race decided: nothing changes."""
    wid = await start(settings, timed_race, {"n": 2, "fast": 1, "gate": "won", "deadline_s": 5})
    async with running_worker(settings, REGISTRY) as worker, running_relay(settings):
        await wait_for(lambda: all_done(settings.database_url or "", [wid]),
                       what="race won and merged")
        assert await fetchval(settings.database_url or "", "SELECT r.finished_at < f.deadline_at"
                              " FROM workflow_runs r JOIN forks f USING (workflow_id) "
                              "WHERE r.workflow_id = $1", wid) is True
        await open_gates(settings, "won", 2)
        await wait_for(discarded_checkpoints(settings, wid, 1), what="loser discarded")
        await wait_for(deadline_sent(settings, wid), what="deadline message sent when due")
        await wait_for(lambda: drained(worker), what="deadline message consumed")
    run = (await fetch(settings.database_url or "", "SELECT status, error FROM workflow_runs "
                       "WHERE workflow_id = $1", wid))[0]
    assert tuple(run) == ("completed", None)
    fork = (await fetch(settings.database_url or "", "SELECT status, resolution, winner FROM "
                        "forks WHERE workflow_id = $1", wid))[0]
    assert tuple(fork) == ("merged", "race", "f0.s1")
    rows = await fetch(settings.database_url or "", "SELECT branch, status FROM branches "
                       "WHERE workflow_id = $1 ORDER BY branch", wid)
    assert [tuple(r) for r in rows] == [("f0.s0", "discarded"), ("f0.s1", "merged")]
    settled = await main_state(settings, wid, "settle")
    assert settled["winners"] == ["f0.s1"]


async def drained(worker: Any) -> bool:
    depth = await worker.queue.depth()
    return bool(depth.visible == 0 and depth.inflight == 0 and worker.held == 0)


async def test_the_deadline_fires_with_no_worker_running(settings):
    """The only worker is SIGKILLed while the branches are held; with no worker at all, the
    relay sends the deadline message when it falls due (the run is still running: nobody has
    read it); a worker process started afterwards ends the race."""
    wid = await start(settings, timed_race, {"n": 2, "gate": "zero", "deadline_s": 3})
    first = spawn_worker(settings, modules=MODULES)
    try:
        await wait_for(searching(settings, 2), what="both branches in search")
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        stop_process(first)
    async with running_relay(settings):
        await wait_for(deadline_sent(settings, wid), what="deadline sent with no worker")
    assert await fetchval(settings.database_url or "", "SELECT status FROM workflow_runs "
                          "WHERE workflow_id = $1", wid) == "running"
    second = spawn_worker(settings, modules=MODULES)
    try:
        await wait_for(lambda: all_done(settings.database_url or "", [wid], "failed"),
                       timeout=60, what="race ended by a worker started after the due time")
        await assert_ended_by_deadline(settings, wid, 2)
        await open_gates(settings, "zero", 2)
    finally:
        assert stop_process(second) == 0


async def test_the_branches_json_names_the_deadline(settings):
    """`--tree --json` (the API's shape) carries the fork's deadline (database time)."""
    wid = await start(settings, timed_race, {"n": 1, "gate": "json", "deadline_s": 3600})
    async with running_worker(settings, REGISTRY):
        await wait_for(searching(settings, 1), what="the branch in search")
        output = await inspect(settings, MODULES, wid, "--tree", "--json")
        await open_gates(settings, "json", 1)
        await wait_for(lambda: all_done(settings.database_url or "", [wid]), what="completed")
    forks = json.loads(output)["forks"]
    stored = await fetchval(settings.database_url or "", "SELECT deadline_at FROM forks "
                            "WHERE workflow_id = $1", wid)
    assert [f["deadline_at"] for f in forks] == [stored.isoformat()]


async def timers_due_soon(settings: Settings) -> float | None:
    """One round of the orchestrator's exporter; the gauge it set."""
    async with store_for(settings.database_url or "") as store:
        exporter = QueueDepthExporter(queue=None, views=Views(store.pool))
        await exporter.poll_once()
    assert exporter.last_error is None
    return REGISTRY_METRICS.get_sample_value("phasegate_timers_due_soon")


async def test_the_timers_gauge_counts_an_open_race_whose_deadline_is_due_soon(settings):
    """The autoscaler's second trigger sees a race's deadline like a timer: a race due within
    the minute counts (its run is running, not waiting), one due in ten minutes does not yet,
    and once the race is won its deadline message changes nothing and no longer counts."""
    soon = await start(settings, timed_race, {"n": 1, "gate": "gauge-soon", "deadline_s": 30})
    later = await start(settings, timed_race,
                        {"n": 1, "gate": "gauge-later", "deadline_s": 600})
    async with running_worker(settings, REGISTRY):
        await wait_for(searching(settings, 2), what="both races' branches in search")
        assert await count(settings, "SELECT count(*) FROM outbox WHERE due_at IS NOT NULL "
                           "AND sent_at IS NULL") == 2
        assert await timers_due_soon(settings) == 1.0
        await open_gates(settings, "gauge-soon", 1)
        await wait_for(lambda: all_done(settings.database_url or "", [soon]), what="race won")
        assert await timers_due_soon(settings) == 0.0
        await open_gates(settings, "gauge-later", 1)
        await wait_for(lambda: all_done(settings.database_url or "", [later]), what="won too")


async def test_after_the_deadline_an_operator_can_promote_a_discarded_branch(settings):
    """Both branches committed `draft` and are held in `proofread` when the deadline ends the
    race. The run failed; a supervisor merge promotes f0.s1's last committed state (its
    draft) and the run goes on to `publish`."""
    wid = await start(settings, drafts, {"n": 2, "gate": "late", "deadline_s": 2})
    async with running_worker(settings, REGISTRY), running_relay(settings), \
            store_for(settings.database_url or "") as store, queue_for(settings) as queue:
        await wait_for(lambda: all_done(settings.database_url or "", [wid], "failed"),
                       what="the race ended by its deadline")
        assert await count(settings, "SELECT count(*) FROM test_invocations "
                           "WHERE phase = 'proofread'") == 2
        outcome = await Control(store.pool, queue, REGISTRY, actor="test").merge(
            wid, "f0.s1", "the draft will do")
        assert outcome.action == "merge" and outcome.run.status == "running"
        await wait_for(lambda: all_done(settings.database_url or "", [wid]), what="published")
        await open_gates(settings, "late", 2)
        await wait_for(discarded_checkpoints(settings, wid, 1), what="s0's proofread discarded")
    published = await main_state(settings, wid, "publish")
    assert published == {"i": 1, "gate": "late", "draft": "draft 1", "published": True}
    fork = (await fetch(settings.database_url or "", "SELECT status, resolution, winner FROM "
                        "forks WHERE workflow_id = $1", wid))[0]
    assert tuple(fork) == ("merged", "supervisor", "f0.s1")
    rows = await fetch(settings.database_url or "", "SELECT branch, status FROM branches "
                       "WHERE workflow_id = $1 ORDER BY branch", wid)
    assert [tuple(r) for r in rows] == [("f0.s0", "discarded"), ("f0.s1", "merged")]
    assert await count(settings, "SELECT count(*) FROM test_invocations WHERE phase = "
                       "'choose'") == 0
