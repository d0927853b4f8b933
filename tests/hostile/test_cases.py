"""Hostile input and hostile workflow code, case by case, against real worker processes,
Postgres and SQS over HTTP. Each case ends in a defined state (a run failed with an error, or
a message quarantined with a reason) and no worker dies (docs/reference/failures.md)."""

from __future__ import annotations

import json

from phasegate.envelope import canonical_json, phase_message, state_hash
from phasegate.orchestrator.starter import start_workflow
from phasegate.signals import send_signal
from tests.helpers import all_done, fetch, fetchval, queue_for, store_for, wait_for
from tests.hostile import workflows_hostile as hw
from tests.hostile.fleet import (
    CANARY,
    assert_nothing_leaked,
    fleet,
    quarantine_codes,
    quarantined,
    runs,
    send,
)


async def start(settings, workflow, input):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        return (await start_workflow(store, queue, workflow=workflow, input=input)).workflow_id


async def test_phase_exit_interrupt_and_own_cancel_fail_the_run_not_the_worker(settings,
                                                                                tmp_path):
    ids = {wf.name: await start(settings, wf, {"secret": CANARY})
           for wf in (hw.exits, hw.interrupts, hw.cancels)}
    good = await start(settings, hw.good, {"n": 1})
    with fleet(settings, tmp_path):
        await wait_for(lambda: all_done(settings.database_url, list(ids.values()), "failed"),
                       what="hostile runs failed")
        await wait_for(lambda: all_done(settings.database_url, [good]), what="good run done")
    rows = await runs(settings)
    # Non-retryable at once (attempts 1), the error names the type, never the message.
    assert rows[ids["exits"]]["error"].startswith("SystemExit (message withheld")
    assert rows[ids["interrupts"]]["error"] == "KeyboardInterrupt"
    assert rows[ids["cancels"]]["error"] == "CancelledError"
    assert {rows[i]["attempts"] for i in ids.values()} == {1}
    await assert_nothing_leaked(settings)


UNSTORABLE_STATES = {
    "nul": "UnstorableValue: state.text: a string contains a NUL character",
    "surrogate": "UnstorableValue: state.text: a string contains a lone surrogate",
    "surrogate_key": "UnstorableValue: state: an object key contains a lone surrogate",
    "deep": "UnstorableValue: state.tree",
    "huge": "UnstorableValue: state: 1048597 bytes of JSON exceed the limit of 1048576",
    "nan": "UnstorableValue: state.ratio: NaN and Infinity are not JSON",
    "infinity": "UnstorableValue: state.ratio: NaN and Infinity are not JSON",
    "not_json": "UnstorableValue: state.obj: object is not a JSON type",
    "int_key": "UnstorableValue: state: object keys must be strings",
}


async def test_unstorable_returned_state_fails_the_run_at_once(settings, tmp_path):
    ids = {kind: await start(settings, hw.returns, {"return": kind})
           for kind in UNSTORABLE_STATES}
    with fleet(settings, tmp_path):
        await wait_for(lambda: all_done(settings.database_url, list(ids.values()), "failed"),
                       what="failed")
    rows = await runs(settings)
    for kind, error in UNSTORABLE_STATES.items():
        assert rows[ids[kind]]["error"].startswith(error), kind
        assert rows[ids[kind]]["attempts"] == 1, kind  # not retried: it would fail again
    assert await fetchval(settings.database_url, "SELECT count(*) FROM checkpoints") == 0


def deep_json(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# Raw start messages any producer could send; the body text is what goes on the wire.
def start_body(wid: str, input_json: str, **extra: object) -> str:
    head = json.dumps({"v": 1, "kind": "start", "workflow_id": wid, "workflow": "good",
                       **extra})
    return head[:-1] + f', "input": {input_json}}}'


REFUSED_STARTS = {
    "h-nul": (start_body("h-nul", json.dumps({"a": CANARY + "\u0000"})), "unstorable_input"),
    "h-surrogate": (start_body("h-surrogate", '{"a": "' + CANARY + '\\ud800"}'),
                    "unstorable_input"),
    "h-deep": (start_body("h-deep", deep_json(100)), "unstorable_input"),
    "h-deeper": (start_body("h-deeper", deep_json(100_000)), "too_deep"),
    "h-inf": (start_body("h-inf", '{"x": 1e400, "c": "' + CANARY + '"}'), "unstorable_input"),
    "h-seq": (start_body("h-seq", "{}", seq=3), "start_seq"),
    "h-phase": (start_body("h-phase", "{}", phase="two"), "start_phase"),
    "h-branch": (start_body("h-branch", "{}", branch="b1"), "start_branch"),
}


async def test_refused_starts_leave_no_run_row(settings, tmp_path):
    for wid, (body, _) in REFUSED_STARTS.items():
        await send(settings, body, group="h-branch/b1" if wid == "h-branch" else wid)
    good = await start(settings, hw.good, {"n": 1})
    with fleet(settings, tmp_path):
        await wait_for(lambda: quarantined(settings, len(REFUSED_STARTS)), what="quarantined")
        await wait_for(lambda: all_done(settings.database_url, [good]), what="good run done")
    codes = await quarantine_codes(settings)
    # "h-deeper" did not parse, so its id is unknown to the quarantine row.
    expected = {wid: [code] for wid, (_, code) in REFUSED_STARTS.items() if wid != "h-deeper"}
    assert codes == {**expected, None: ["too_deep"]}
    assert list(await runs(settings)) == [good]  # no row left `running`
    bodies = await assert_nothing_leaked(settings)
    assert len(bodies) == len(REFUSED_STARTS)


async def test_strict_envelope_and_group(settings, tmp_path):
    wid = await start(settings, hw.good, {"n": 1})
    wrong = {
        "v-true": ({"v": True, "kind": "start", "workflow_id": "v-true", "workflow": "good"},
                   "v-true", "invalid_envelope"),
        "v-float": ({"v": 1.0, "kind": "start", "workflow_id": "v-float", "workflow": "good"},
                    "v-float", "invalid_envelope"),
        "seq-str": ({"v": 1, "kind": "phase", "workflow_id": wid, "workflow": "good",
                     "seq": "1", "phase": "two"}, wid, "invalid_envelope"),
        "seq-huge": ({"v": 1, "kind": "phase", "workflow_id": wid, "workflow": "good",
                      "seq": 2**40, "phase": "two"}, wid, "invalid_envelope"),
        # Its run's group is its id: another group would let two of its phases run at once.
        "other-group": ({"v": 1, "kind": "start", "workflow_id": "g-1", "workflow": "good"},
                        "somebody-else", "group_mismatch"),
        # A branch's group is workflow_id/branch (phasegate/envelope.py message_group_id).
        "branch-bare": ({"v": 1, "kind": "phase", "workflow_id": wid, "workflow": "good",
                         "seq": 1, "phase": "two", "branch": "b1"}, wid, "group_mismatch"),
    }
    for body, group, _ in wrong.values():
        await send(settings, body, group=group)
    with fleet(settings, tmp_path):
        await wait_for(lambda: quarantined(settings, len(wrong)), what="quarantined")
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="good run done")
    reasons = sorted(r["reason"].split(":")[0] for r in await fetch(
        settings.database_url, "SELECT reason FROM quarantine"))
    assert reasons == sorted(code for _, _, code in wrong.values())
    assert list(await runs(settings)) == [wid]
    await assert_nothing_leaked(settings)


async def test_phase_timeout_fails_the_attempt_and_frees_the_slot(settings, tmp_path):
    settings = settings.model_copy(update={"max_attempts": 2, "concurrency": 1})
    hung = await start(settings, hw.hangs, {})
    hung_own = await start(settings, hw.hangs_own, {})
    good = await start(settings, hw.good, {"n": 1})
    # One slot: the good run can only finish if each timed-out attempt gave its slot back.
    with fleet(settings, tmp_path, extra_env={"PHASEGATE_PHASE_TIMEOUT_S": "1"}):
        await wait_for(lambda: all_done(settings.database_url, [hung, hung_own], "failed"),
                       what="hung runs failed")
        await wait_for(lambda: all_done(settings.database_url, [good]), what="good run done")
    rows = await runs(settings)
    assert rows[hung]["error"] == "PhaseTimeout: phase forever ran longer than 1s"
    assert rows[hung_own]["error"] == "PhaseTimeout: phase forever_own ran longer than 0.5s"
    assert rows[hung]["attempts"] == rows[hung_own]["attempts"] == 2  # retryable


async def test_a_crashing_transition_is_quarantined_after_three_deliveries(settings, tmp_path):
    wid = "crashing-1"
    state = canonical_json({"secret": CANARY})
    await fetch(settings.database_url,
                "INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, "
                "current_phase, schema_version, input) VALUES ($1, 'legacy', 'running', 1, "
                "'second', 1, 'null')", wid)
    await fetch(settings.database_url,
                "INSERT INTO checkpoints (workflow_id, seq, phase, kind, schema_version, state, "
                "state_hash) VALUES ($1, 0, 'first', 'phase', 1, $2::jsonb, $3)",
                wid, state, state_hash(state))
    message = phase_message(wid, "legacy", 1, "second")
    await send(settings, message.to_json(), group=message.group_id)
    good = await start(settings, hw.good, {"n": 1})
    with fleet(settings, tmp_path, workers=2):
        await wait_for(lambda: all_done(settings.database_url, [wid], "failed"), what="failed")
        await wait_for(lambda: all_done(settings.database_url, [good]), what="good run done")
    row = (await runs(settings))[wid]
    assert row["error"].startswith("transition_crashed: SystemExit (message withheld")
    assert row["error"].endswith("on 3 deliveries; the message was quarantined")
    assert await quarantine_codes(settings) == {wid: ["transition_crashed"]}
    assert await fetchval(settings.database_url,
                          "SELECT crashes FROM transition_crashes") == 3
    (body,) = await assert_nothing_leaked(settings)
    assert json.loads(body)["phasegate_quarantined"]["reason"] == "transition_crashed"
    async with queue_for(settings) as queue:
        depth = await queue.depth()
    assert (depth.visible, depth.inflight) == (0, 0)  # deleted, not left for SQS's redrive


async def _waiting(settings, workflow_id: str) -> bool:
    return await fetchval(settings.database_url, "SELECT status FROM workflow_runs "
                          "WHERE workflow_id = $1", workflow_id) == "waiting"


async def _queue_empty(settings) -> bool:
    async with queue_for(settings) as queue:
        depth = await queue.depth()
    return depth.visible == 0 and depth.inflight == 0


async def test_a_forged_message_does_not_end_a_wait(settings, tmp_path):
    """Anyone who can send to the queue can write the message of the phase after a wait. It
    comes before the wait is over, so it is dropped as stale: the run keeps waiting for its
    approval, and the phase after it sees the approval, not a timeout's None."""
    wid = await start(settings, hw.gated, {"secret": CANARY})
    with fleet(settings, tmp_path):
        await wait_for(lambda: _waiting(settings, wid), what="the run waiting for approval")
        await send(settings, {"v": 1, "kind": "phase", "workflow_id": wid, "workflow": "gated",
                              "seq": 1, "phase": "act"}, group=wid)
        await wait_for(lambda: _queue_empty(settings), what="the forged message handled")
        assert await _waiting(settings, wid)
        async with store_for(settings.database_url) as store, queue_for(settings) as queue:
            sent = await send_signal(store.pool, wid, "approval", {"ok": True}, queue=queue)
        assert sent.delivered
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run done")
    [state] = await fetch(settings.database_url, "SELECT state::text FROM checkpoints "
                          "WHERE workflow_id = $1 AND seq = 1", wid)
    assert json.loads(state["state"]) == {"approval": {"ok": True}}
    assert await quarantine_codes(settings) == {}
    await assert_nothing_leaked(settings)
