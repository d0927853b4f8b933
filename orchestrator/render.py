"""The control CLI's tables and views, drawn with rich.

Every view is a rich renderable (``*_view``); the string functions render it for a pipe or a
terminal. On a terminal: bold headers and the terminal's width. Anywhere else: no escape
codes, no wrapping (one record per line however wide), no trailing spaces, so the output
stays plain and parseable (``awk``, ``grep``, tests). Cell values are ``Text``, never
markup: a workflow name like ``[bold]x`` is printed as it is.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

# Wide enough that no plain line is ever wrapped (a pipe has no width).
PLAIN_WIDTH = 100_000


def console(*, color: bool, file: Any = None) -> Console:
    """A terminal console (styles, its own width) or a plain one (neither)."""
    if color:
        return Console(file=file, force_terminal=True, highlight=False, emoji=False)
    return Console(file=file, force_terminal=False, no_color=True, color_system=None,
                   width=PLAIN_WIDTH, highlight=False, emoji=False, soft_wrap=True)


def to_text(renderable: RenderableType, *, color: bool = False) -> str:
    buffer = io.StringIO()
    console(color=color, file=buffer).print(renderable)
    return "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").split("\n"))


def table_view(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    view = Table(box=None, show_edge=False, pad_edge=False, header_style="bold",
                 highlight=False)
    for header in headers:
        view.add_column(Text(header.upper()), no_wrap=True)
    for row in rows:
        view.add_row(*(Text(_cell(v)) for v in row))
    return view


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, color: bool = False) -> str:
    return to_text(table_view(headers, rows), color=color)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def tier(value: int | None, label: str | None) -> str:
    if value is None:
        return "-"
    return f"{value} {label}" if label else str(value)


def status_view(summary: dict[str, Any], fleet: dict[str, Any]) -> Group:
    queue = summary.get("queue") or {}
    if queue.get("error"):
        queue_line = f"queue: unavailable ({queue['error']})"
    else:
        queue_line = (f"queue: {queue.get('visible')} visible, {queue.get('inflight')} "
                      f"in flight, {queue.get('delayed')} delayed")
    rows = [[r["status"], r["workflow"], r["phase"], tier(r["tier"], r["tier_label"]),
             r["runs"], age(r["oldest_age_s"])] for r in summary.get("runs", [])]
    runs: RenderableType = (
        table_view(["status", "workflow", "phase", "tier", "runs", "idle"], rows)
        if rows else Text("no workflow runs"))
    note = Text("(completed and cancelled: last 24 h; others: all)", style="dim")
    lines = [queue_line, fleet_line(fleet.get("fleet") or {}),
             workers_line(fleet.get("workers")), ages_line(fleet.get("ages"))]
    return Group(*(Text(line) for line in lines if line is not None), Text(""), runs, note)


def status(summary: dict[str, Any], fleet: dict[str, Any], *, color: bool = False) -> str:
    return to_text(status_view(summary, fleet), color=color)


def watch(view: Callable[[], RenderableType], *, interval: float, count: int | None = None,
          title: str = "phasegate status (Ctrl-C to stop)", out: Console | None = None) -> None:
    """Redraw ``view()`` in place on a terminal (rich's Live region: the lines it drew are
    rewritten, the rest of the screen and the scrollback are left alone) every ``interval``
    seconds, ``count`` times or until interrupted."""
    shown = 0
    with Live(console=out or console(color=True), auto_refresh=False,
              redirect_stdout=False, redirect_stderr=False) as live:
        while True:
            header = Text(time.strftime("%H:%M:%S ") + title, style="bold")
            live.update(Group(header, view()), refresh=True)
            shown += 1
            if count is not None and shown >= count:
                return
            time.sleep(interval)  # the refresh rate of a human-facing display


def fleet_line(fleet: dict[str, Any]) -> str:
    if not fleet.get("in_cluster"):
        return f"fleet: {fleet.get('message') or 'not running in a Kubernetes cluster'}"
    if fleet.get("desired_replicas") is None and fleet.get("message"):
        return f"fleet: {fleet['message']}"
    line = (f"fleet: {fleet.get('namespace')}/{fleet.get('deployment')} "
            f"{fleet.get('ready_replicas')}/{fleet.get('desired_replicas')} ready, "
            f"{fleet.get('pods')} pods")
    terminations = fleet.get("terminations") or []
    if terminations:
        counts: dict[str, int] = {}
        for t in terminations:
            counts[t["reason"]] = counts.get(t["reason"], 0) + 1
        line += "; recent terminations: " + ", ".join(
            f"{reason} x{n}" for reason, n in sorted(counts.items()))
    return line


def workers_line(workers: list[dict[str, Any]] | None) -> str | None:
    """The live workers (worker_presence) in one line; None: the API did not say (an older
    orchestrator)."""
    if workers is None:
        return None
    if not workers:
        return "workers: none live (the fleet may be scaled to zero)"
    states: dict[str, int] = {}
    for w in workers:
        states[w["watchdog"]] = states.get(w["watchdog"], 0) + 1
    busy, slots = sum(w["in_flight"] for w in workers), sum(w["concurrency"] for w in workers)
    return (f"workers: {len(workers)} live, {busy} of {slots} in flight; watchdog "
            + ", ".join(f"{state} x{n}" for state, n in sorted(states.items())))


def ages_line(ages: dict[str, Any] | None) -> str | None:
    """How long messages have waited (database time); None: the API did not say."""
    if ages is None:
        return None
    return (f"messages: oldest not started {age(ages['not_started_s'])} "
            f"({ages['not_started']}), oldest uncommitted {age(ages['uncommitted_s'])} "
            f"({ages['uncommitted']})")


def inspect(run: dict[str, Any], checkpoints: list[dict[str, Any]],
            actions: list[dict[str, Any]], *, include_state: bool = False,
            color: bool = False) -> str:
    fields = [("id", run["workflow_id"]), ("workflow", run["workflow"]),
              ("status", run["status"]), ("phase", run["current_phase"] or "-"),
              ("seq", run["seq"]), ("tier", tier(run["tier"], run["tier_label"])),
              ("attempts", run["attempts"]), ("epoch", run["epoch"]),
              ("created", run["created_at"]), ("updated", run["updated_at"]),
              ("finished", run["finished_at"] or "-")]
    if run.get("due_at"):  # waiting: when the next phase becomes deliverable
        fields.append(("due_at", utc_iso(run["due_at"])))
    if run.get("waiting_for"):
        fields.append(("waiting_for", f"{run['waiting_for']} (a signal; or due_at, whichever "
                                      "comes first)"))
    if run.get("error"):
        fields.append(("error", run["error"]))
    parts: list[RenderableType] = [Text(f"{name + ':':<10} {value}") for name, value in fields]
    parts += [Text(""), table_view(
        ["seq", "branch", "phase", "kind", "tier", "hash", "worker", "committed"],
        [[c["seq"], c["branch"], c["phase"], c["kind"], tier(c["tier"], c["tier_label"]),
          c["state_hash"][:12], c["worker_id"], c["created_at"]] for c in checkpoints])
        if checkpoints else Text("no checkpoints yet")]
    if include_state:
        parts += [Text("")] + [Text(f"seq {c['seq']} ({c['kind']}): "
                                    f"{json.dumps(c.get('state'), sort_keys=True)}")
                               for c in checkpoints]
    if actions:
        parts += [Text(""), table_view(
            ["action", "from", "seq", "reason", "by", "at"],
            [[a["action"], a["from_status"], a["seq"], a["reason"], a["actor"],
              a["created_at"]] for a in actions])]
    return to_text(Group(*parts), color=color)


def runs(items: list[dict[str, Any]], *, color: bool = False) -> str:
    """``phasegate list``: one line per run, newest first."""
    if not items:
        return "no runs"
    return table(["id", "status", "workflow", "phase", "tier", "region", "created"],
                 [[r["workflow_id"], r["status"], r["workflow"], r["current_phase"],
                   tier(r["tier"], r["tier_label"]), r.get("region"), r["created_at"]]
                  for r in items], color=color)
def signal(result: dict[str, Any]) -> str:
    what = ("duplicate (its idempotency key was seen before): nothing changed"
            if result["duplicate"] else
            "delivered: the run's wait ends" if result["delivered"] else
            "kept: the run does not wait for it yet")
    line = f"signal {result['name']} to {result['workflow_id']}: {what}"
    if result["delivered"] and not result["duplicate"] and not result["sent"]:
        line += " (the relay sends the resuming message)"
    return line


def action(result: dict[str, Any]) -> str:
    run = result["run"]
    line = f"{result['action']}: {run['workflow_id']} is now {run['status']}"
    if result.get("sent") is False:
        line += " (resume message queued in the outbox; the relay will send it)"
    return line


def utc_iso(value: Any) -> str:
    """A time from the API or the database as UTC ISO 8601 (``2026-12-01T12:00:00+00:00``)."""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:  # the database's timestamptz always has one; be explicit
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="seconds")


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
