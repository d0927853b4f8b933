"""Fast checks of the chaos suite's parts and of the engine fix it led to (no servers)."""

from __future__ import annotations

import asyncpg
import pytest

from bench.chaos.fleet import Fleet, WorkerProcess
from bench.chaos.keyed import (
    SlotWatch,
    i10_keys_within_limit,
    i12_rate_kept,
    in_burst,
    keyed_ordinal,
    keyed_prefix,
)
from bench.chaos.pg_proxy import classify
from bench.chaos.schedule import KILL_POINTS, POISON_KINDS, SQS_FAULTS, build_schedule
from bench.chaos.workload import chaos_keyed, chaos_paced, expected_key, keyed_kind
from phasegate.faults import POINTS
from phasegate.sql import queries
from phasegate.steps import LedgerUnavailable, _StorePool, idempotency_key
from phasegate.worker.transition import DATABASE_DOWN


def test_same_seed_same_schedule_and_every_kind_scheduled() -> None:
    one = build_schedule(5, workflows=100, workers=3)
    assert one.to_json() == build_schedule(5, workflows=100, workers=3).to_json()
    assert one.to_json() != build_schedule(6, workflows=100, workers=3).to_json()
    kinds = {e.kind for e in one.events}
    assert {"sigkill_worker", "sigterm_worker", "sigkill_relay", "pg_restart", "pg_flaky",
            "duplicates", "poison", "sqs_window"} <= kinds
    windows = {e.detail["fault"] for e in one.events if e.kind == "sqs_window"}
    assert windows == set(SQS_FAULTS)
    assert {p.partition("@")[0] for p in one.kill_points[:len(KILL_POINTS)]} == set(KILL_POINTS)
    assert set(KILL_POINTS) <= POINTS
    assert len(POISON_KINDS) == 10


def test_a_fleet_without_continuation_is_never_armed_at_mid_chain() -> None:
    """Without local continuation no worker reaches mid_chain: arming it would fail I6 by
    construction. Every other point is still armed."""
    schedule = build_schedule(5, workflows=100, workers=3, continuation=False)
    armed = {p.partition("@")[0] for p in schedule.kill_points}
    assert armed == set(KILL_POINTS) - {"mid_chain"}


def test_kill_points_that_never_fired_are_armed_again_after_the_window(tmp_path) -> None:
    """A slow fleet may end the fault window before reaching a point's N (I6 failed on a
    loaded machine): each kind that never fired is queued again at its first hit, and one
    live worker per kind is restarted to take it, those holding such a kind first."""
    import subprocess
    import sys

    fleet = Fleet(env={}, log_dir=tmp_path, seed=1, kill_points=[
        "after_send@9", "step_effect@4", "after_receive@3", "after_send@5"])
    fired, quiet = tmp_path / "fired.log", tmp_path / "quiet.log"
    fired.write_text("phasegate: fault injection: SIGKILL at after_receive\n")
    quiet.write_text("")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fleet.retire(WorkerProcess(0, 1, "after_receive@3", ended, fired), -9)
        fleet.workers = {0: WorkerProcess(0, 2, "", live, quiet),
                         1: WorkerProcess(1, 1, "step_effect@4", live, quiet),
                         2: WorkerProcess(2, 1, "", ended, quiet)}
        assert fleet.end_window() == [1, 0]
        assert fleet.pending == ["after_send@1", "step_effect@1"]
        # Ended by the runner before its point fired: queued once, and only if never fired.
        fleet.retire(WorkerProcess(1, 1, "step_effect@4", ended, quiet), 0)
        fleet.retire(WorkerProcess(0, 2, "after_receive@7", ended, quiet), 0)
        assert fleet.pending == ["after_send@1", "step_effect@1"]
        # ... nor while a live worker holds it.
        fleet.workers[1] = WorkerProcess(1, 2, fleet.take_point(), live, quiet)
        fleet.retire(WorkerProcess(2, 1, "after_send@9", ended, quiet), 0)
        assert fleet.pending == ["step_effect@1"]
        fired.write_text("phasegate: fault injection: SIGKILL at step_effect\n")
        fleet.retire(WorkerProcess(0, 3, "step_effect@4", ended, fired), -9)
        assert fleet.pending == []
    finally:
        live.kill()
        live.wait()


def test_outages_never_hide_other_sqs_windows() -> None:
    for seed in range(20):
        events = build_schedule(seed, workflows=100, workers=3).events
        outages = [(e.at_s, e.at_s + float(str(e.detail["duration_s"]))) for e in events
                   if e.kind == "sqs_window" and e.detail["fault"] == "outage"]
        for e in events:
            if e.kind == "sqs_window" and e.detail["fault"] != "outage":
                end = e.at_s + float(str(e.detail["duration_s"]))
                assert not any(a < end and e.at_s < b for a, b in outages), (seed, e)


def test_the_proxy_recognises_the_statements_it_cuts() -> None:
    q = queries()
    assert classify(q["commit_phase"]) == "phase_commit"
    assert classify(q["commit_phases"]) == "phase_commit"  # a group commit
    # A plain advance alone, and a continued hop or a leased send, alone and grouped.
    for name in ("advance_phase", "continue_phase", "continue_phases"):
        assert classify(q[name]) == "phase_commit", name
    assert classify(q["step_claim"]) == "step_claim"
    assert classify(q["step_complete"]) == "step_complete"
    assert classify(q["load_for_phase"]) is None


def test_the_checker_computes_the_design_key_independently() -> None:
    assert expected_key("wf_1", "main", 3, 1) == idempotency_key("wf_1", "main", 3, 1)
    assert len(expected_key("wf_1", "main", 3, 1)) == 32


class _DownPool:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def fetchrow(self, *args: object) -> None:
        raise self.error

    async def fetch(self, *args: object) -> None:
        raise self.error

    async def execute(self, *args: object) -> None:
        raise self.error


@pytest.mark.parametrize("error", [
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
    ConnectionResetError("reset"), asyncpg.exceptions.CannotConnectNowError("starting up"),
    # Seen through PgBouncer while the server restarts: the protocol state machine on a link
    # dropped mid-statement (chaos seed 12, pgbouncer route).
    asyncpg.InternalClientError("cannot switch to state 15; another operation (2) is in progress")])
async def test_a_database_outage_under_a_step_record_is_not_a_phase_error(error) -> None:
    pool = _StorePool(_DownPool(error))  # type: ignore[arg-type]
    for call in (pool.fetchrow, pool.fetch, pool.execute):
        with pytest.raises(LedgerUnavailable):
            await call("SELECT 1")
    # handle() releases what DATABASE_DOWN matches with a backoff, without charging the phase.
    assert isinstance(LedgerUnavailable("x"), DATABASE_DOWN)


async def test_a_real_query_error_under_a_step_record_stays_what_it_is() -> None:
    pool = _StorePool(_DownPool(asyncpg.exceptions.UniqueViolationError("dup")))  # type: ignore[arg-type]
    with pytest.raises(asyncpg.exceptions.UniqueViolationError):
        await pool.execute("INSERT ...")


@pytest.mark.parametrize("after_s", [0.3, 0.8])
def test_a_worker_stopped_while_still_importing_exits_cleanly(after_s: float) -> None:
    """A SIGTERM before the worker's event loop exists (a pod scaled in right after it
    started) is a clean stop: exit 0, not death by signal (found by bench/chaos)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "PHASEGATE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none",
           "PHASEGATE_QUEUE_URL": "http://127.0.0.1:1/q", "PHASEGATE_DLQ_URL": "http://127.0.0.1:1/d",
           "PHASEGATE_WORKFLOW_MODULES": "bench.chaos.workload", "PHASEGATE_METRICS_PORT": "0",
           "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
           "AWS_DEFAULT_REGION": "us-east-1"}
    process = subprocess.Popen([sys.executable, "-m", "phasegate.cli", "worker"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(after_s)  # the fault itself: when the SIGTERM lands
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def test_a_worker_stopped_while_its_dependencies_hang_stops_at_once() -> None:
    """Endpoints that accept and never answer (an outage): a SIGTERM while the worker still
    proves its dependencies must not wait for the hanging probe (found by bench/chaos: such a
    worker outlived the drain grace and was SIGKILLed)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(50)
    port = server.getsockname()[1]
    held: list[socket.socket] = []

    def accept_and_never_answer() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept_and_never_answer, daemon=True).start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ,  # Postgres hangs the same way: the first probe never returns
           "PHASEGATE_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/none",
           "PHASEGATE_QUEUE_URL": f"{endpoint}/q", "PHASEGATE_DLQ_URL": f"{endpoint}/d",
           "PHASEGATE_SQS_ENDPOINT_URL": endpoint, "PHASEGATE_AWS_REGION": "us-east-1",
           "PHASEGATE_WORKFLOW_MODULES": "bench.chaos.workload", "PHASEGATE_METRICS_PORT": "0",
           "PHASEGATE_DB_CONNECT_TIMEOUT_S": "30", "AWS_ACCESS_KEY_ID": "local",
           "AWS_SECRET_ACCESS_KEY": "local"}
    process = subprocess.Popen([sys.executable, "-m", "phasegate.cli", "worker"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)  # the fault itself: the SIGTERM lands while a probe hangs
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - signalled < 5
    finally:
        if process.poll() is None:
            process.kill()
        server.close()
        for connection in held:
            connection.close()


class _Holders:
    """A pool whose slot-holder query answers the counts given, one answer per sample."""

    def __init__(self, *answers: dict[str, int] | BaseException) -> None:
        self.answers = list(answers)

    async def fetch(self, *args: object) -> list[dict[str, object]]:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return [{"concurrency_key": k, "n": n} for k, n in answer.items()]


async def test_i10_fails_on_a_sample_over_the_limit_and_on_a_queue_never_used() -> None:
    watch = SlotWatch(limit=2)
    pool = _Holders({"a": 1}, ConnectionResetError("restarting"), {"a": 2, "b": 2})
    for at in range(3):
        await watch.sample(pool, float(at))  # type: ignore[arg-type]
    assert (watch.samples, watch.failed, watch.most) == (2, 1, {"a": 2, "b": 2})
    assert i10_keys_within_limit(watch, keyed_runs=10, waited_runs=3).ok
    # No run ever waited: the limit was never put to the test, so the run proves nothing.
    assert not i10_keys_within_limit(watch, keyed_runs=10, waited_runs=0).ok
    await watch.sample(_Holders({"b": 3}), 9.5)  # type: ignore[arg-type]
    result = i10_keys_within_limit(watch, keyed_runs=10, waited_runs=3)
    assert not result.ok and "b: 3 holders at 9.5s" in result.detail


def test_i12_fails_on_a_window_over_the_rate_and_on_a_rate_never_reached() -> None:
    # One admission per key in any 4 s: admissions 4 s apart or more leave every window at one.
    kept = {"tenant-a": [0.0, 4.0, 8.5], "tenant-b": [1.0, 5.0]}
    assert i12_rate_kept(kept, paced_runs=5, waited_runs=3).ok
    # No run waited: the rate was never put to the test.
    assert not i12_rate_kept(kept, paced_runs=5, waited_runs=0).ok
    result = i12_rate_kept({**kept, "tenant-b": [1.0, 4.9]}, paced_runs=5, waited_runs=3)
    assert not result.ok and "'tenant-b': 2" in result.detail
    assert not i12_rate_kept({}, paced_runs=2, waited_runs=1).ok  # nothing admitted at all


def test_keyed_runs_come_in_bursts_one_over_the_limit_and_the_kinds_take_turns() -> None:
    # One run in three keyed, in bursts of three consecutive runs (the limit is two).
    keyed = [i for i in range(36) if keyed_ordinal(i, 3) is not None]
    assert keyed == [6, 7, 8, 15, 16, 17, 24, 25, 26, 33, 34, 35]
    assert [keyed_ordinal(i, 3) for i in keyed] == list(range(12))
    # Only the first of a burst waits for the workload's pace; the others start at once.
    assert [in_burst(keyed_ordinal(i, 3)) for i in (5, 6, 7, 8)] == [False, False, True, True]
    # Two bursts of one kind, then two of the other: each kind gets a burst of each key.
    assert [keyed_prefix(n) for n in range(0, 15, 3)] == ["ck", "ck", "cr", "cr", "ck"]
    assert keyed_ordinal(4, 0) is None and keyed_ordinal(1, 2) is None
    assert keyed_kind("cr1_00002_x") is chaos_paced and keyed_kind("ck1_00002_x") is chaos_keyed
