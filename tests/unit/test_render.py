"""The control CLI's tables and views (rich): plain and parseable without a terminal, styled
and redrawn in place on one."""

from __future__ import annotations

import io
import re

from rich.text import Text

from phasegate.orchestrator import render

ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_table_aligns_columns_and_marks_missing_values() -> None:
    text = render.table(["a", "long header"], [["x", None], ["yyyy", 3]])
    assert text.splitlines() == ["A     LONG HEADER", "x     -", "yyyy  3"]
    assert "\x1b[" not in text
    styled = render.table(["a"], [["x"]], color=True)
    assert styled.startswith("\x1b[1mA") and ESCAPE.sub("", styled).split() == ["A", "x"]


def test_plain_output_never_wraps_and_never_reads_markup() -> None:
    long = "w" * 300
    text = render.table(["workflow", "phase"], [[long, "[bold]p[/]"], ["x", "y"]])
    assert text.splitlines()[1].split() == [long, "[bold]p[/]"]  # one record, one line
    assert len(text.splitlines()) == 3


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


def test_status_adds_live_workers_and_message_ages_when_the_api_reports_them() -> None:
    summary = {"queue": {"visible": 0, "inflight": 0, "delayed": 0}, "runs": []}
    workers = [{"worker_id": "w-a", "watchdog": "ok", "in_flight": 2, "concurrency": 4},
               {"worker_id": "w-b", "watchdog": "pressure", "in_flight": 0, "concurrency": 2},
               {"worker_id": "w-c", "watchdog": "ok", "in_flight": 1, "concurrency": 4}]
    ages = {"not_started_s": 90.0, "not_started": 3, "uncommitted_s": None, "uncommitted": 0}
    lines = render.status(summary, {"fleet": {}, "workers": workers, "ages": ages}).splitlines()
    assert lines[2:4] == ["workers: 3 live, 3 of 10 in flight; watchdog ok x2, pressure x1",
                          "messages: oldest not started 1.5m (3), oldest uncommitted - (0)"]
    idle = render.status(summary, {"fleet": {}, "workers": [], "ages": ages}).splitlines()
    assert idle[2] == "workers: none live (the fleet may be scaled to zero)"
    # An orchestrator from before these fields: the lines are left out, not made up.
    older = render.status(summary, {"fleet": {}}).splitlines()
    assert not any(line.startswith(("workers:", "messages:")) for line in older)


def test_action_line_says_when_the_relay_will_send() -> None:
    run = {"workflow_id": "x", "status": "running"}
    assert render.action({"action": "retry", "run": run, "sent": True}) == (
        "retry: x is now running")
    assert "relay will send" in render.action({"action": "retry", "run": run, "sent": False})


def test_watch_redraws_in_place_without_clearing_the_screen() -> None:
    out = io.StringIO()
    frames = iter([{"runs": [], "queue": {"visible": n, "inflight": 0, "delayed": 0}}
                   for n in (4, 2)])
    terminal = render.console(color=True, file=out)
    render.watch(lambda: render.status_view(next(frames), {"fleet": {}}), interval=0,
                 count=2, out=terminal)
    drawn = out.getvalue()
    assert "\x1b[2J" not in drawn and "\x1b[H" not in drawn  # no full-screen clear
    assert "\x1b[1A" in drawn or "\x1b[A" in drawn  # the second frame moves up over the first
    plain = ESCAPE.sub("", drawn)
    # two refreshes (Live draws the last frame once more as it stops)
    assert plain.count("queue: 4 visible") == 1 and plain.count("queue: 2 visible") >= 1
    assert plain.index("queue: 4 visible") < plain.index("queue: 2 visible")
    assert plain.rstrip().endswith("(completed and cancelled: last 24 h; others: all)")


def test_status_view_is_a_renderable_for_a_terminal() -> None:
    summary = {"queue": {"visible": 1, "inflight": 0, "delayed": 0},
               "runs": [{"status": "running", "workflow": "w", "phase": "p", "tier": None,
                         "tier_label": None, "runs": 1, "oldest_age_s": 5}]}
    styled = render.to_text(render.status_view(summary, {"fleet": {}}), color=True)
    assert "\x1b[1mSTATUS" in styled  # bold header
    assert ESCAPE.sub("", styled).splitlines() == render.status(summary, {"fleet": {}}).splitlines()
    assert isinstance(render.status_view(summary, {}).renderables[0], Text)


def test_demo_display_is_plain_lines_without_a_terminal() -> None:
    from phasegate.demo import Display

    out = io.StringIO()
    display = Display(render.console(color=False, file=out))
    display.say("starting")
    display.show(["  completed [#...] 1/4", "", "  workers alive 2"])
    display.show(["  completed [##..] 2/4"])  # within the plain refresh period: not printed
    display.close()
    assert out.getvalue().splitlines() == ["starting",
                                           "completed [#...] 1/4 | workers alive 2"]


def test_demo_display_redraws_a_live_region_on_a_terminal() -> None:
    from phasegate.demo import Display

    out = io.StringIO()
    display = Display(render.console(color=True, file=out))
    display.show(["done 1/4"])
    display.say("SIGKILL worker pid 123")
    display.show(["done 4/4"])
    display.close()
    drawn = out.getvalue()
    assert "\x1b[2J" not in drawn  # no full-screen clear
    plain = ESCAPE.sub("", drawn)
    # the message is printed above the live region, which is then drawn again below it
    assert plain.index("done 1/4") < plain.index("SIGKILL worker pid 123") < plain.rindex(
        "done 4/4")
    assert plain.rstrip().endswith("done 4/4")  # the last frame stays on screen


def test_due_at_is_printed_in_utc_whatever_the_source() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    # The API's JSON (pydantic writes UTC as Z), another offset, the database's datetime.
    assert render.utc_iso("2026-12-01T12:00:00.5Z") == "2026-12-01T12:00:00+00:00"
    assert render.utc_iso("2026-12-01T13:00:00+01:00") == "2026-12-01T12:00:00+00:00"
    east = datetime(2026, 12, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert render.utc_iso(east) == "2026-12-01T12:00:00+00:00"
    assert render.utc_iso(datetime(2026, 12, 1, 12, 0, tzinfo=UTC)).endswith("+00:00")
