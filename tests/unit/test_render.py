"""The control CLI's plain-text tables."""

from __future__ import annotations

from phasegate.orchestrator import render


def test_table_aligns_columns_and_marks_missing_values() -> None:
    text = render.table(["a", "long header"], [["x", None], ["yyyy", 3]])
    assert text.splitlines() == ["A     LONG HEADER", "x     -", "yyyy  3"]
    assert render.table(["a"], [["x"]], color=True).startswith(render.BOLD + "A")


def test_age_picks_a_readable_unit() -> None:
    assert [render.age(v) for v in (None, -1, 5, 90, 7200, 3 * 86400)] == [
        "-", "0s", "5s", "1.5m", "2.0h", "3.0d"]


def test_status_renders_queue_fleet_and_runs() -> None:
    summary = {"queue": {"visible": 4, "inflight": 1, "delayed": 0, "error": None},
               "runs": [{"status": "running", "workflow": "w", "phase": "p", "tier": 2,
                         "tier_label": "found", "runs": 7, "oldest_age_s": 61}]}
    fleet = {"fleet": {"in_cluster": True, "namespace": "jobs", "deployment": "pg-worker",
                       "desired_replicas": 3, "ready_replicas": 2, "pods": 3,
                       "terminations": [{"reason": "OOMKilled"}, {"reason": "OOMKilled"},
                                        {"reason": "Evicted"}]}}
    lines = render.status(summary, fleet).splitlines()
    assert lines[0] == "queue: 4 visible, 1 in flight, 0 delayed"
    assert lines[1] == ("fleet: jobs/pg-worker 2/3 ready, 3 pods; recent terminations: "
                        "Evicted x1, OOMKilled x2")
    assert lines[4].split() == ["running", "w", "p", "2", "found", "7", "1.0m"]
    down = render.status({"queue": {"error": "timeout"}, "runs": []},
                         {"fleet": {"in_cluster": False, "message": "not in a cluster"}})
    assert down.splitlines()[:2] == ["queue: unavailable (timeout)", "fleet: not in a cluster"]
    assert "no workflow runs" in down


def test_action_line_says_when_the_relay_will_send() -> None:
    run = {"workflow_id": "x", "status": "running"}
    assert render.action({"action": "retry", "run": run, "sent": True}) == (
        "retry: x is now running")
    assert "relay will send" in render.action({"action": "retry", "run": run, "sent": False})
