"""Plain-text tables for the control CLI (ANSI bold headers on a terminal, nothing else)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

CLEAR_SCREEN = "\x1b[H\x1b[2J"
BOLD = "\x1b[1m"
RESET = "\x1b[0m"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, color: bool = False) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    head = "  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
    lines = [f"{BOLD}{head}{RESET}" if color else head]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in cells]
    return "\n".join(lines)


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


def status(summary: dict[str, Any], fleet: dict[str, Any], *, color: bool = False) -> str:
    queue = summary.get("queue") or {}
    if queue.get("error"):
        queue_line = f"queue: unavailable ({queue['error']})"
    else:
        queue_line = (f"queue: {queue.get('visible')} visible, {queue.get('inflight')} "
                      f"in flight, {queue.get('delayed')} delayed")
    rows = [[r["status"], r["workflow"], r["phase"], tier(r["tier"], r["tier_label"]),
             r["runs"], age(r["oldest_age_s"])] for r in summary.get("runs", [])]
    runs = (table(["status", "workflow", "phase", "tier", "runs", "idle"], rows, color=color)
            if rows else "no workflow runs")
    note = "(completed and cancelled: last 24 h; others: all)"
    return "\n".join([queue_line, fleet_line(fleet.get("fleet") or {}), "", runs, note])


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


def inspect(run: dict[str, Any], checkpoints: list[dict[str, Any]],
            actions: list[dict[str, Any]], *, include_state: bool = False,
            color: bool = False) -> str:
    fields = [("id", run["workflow_id"]), ("workflow", run["workflow"]),
              ("status", run["status"]), ("phase", run["current_phase"] or "-"),
              ("seq", run["seq"]), ("tier", tier(run["tier"], run["tier_label"])),
              ("attempts", run["attempts"]), ("epoch", run["epoch"]),
              ("created", run["created_at"]), ("updated", run["updated_at"]),
              ("finished", run["finished_at"] or "-")]
    if run.get("error"):
        fields.append(("error", run["error"]))
    out = [f"{name + ':':<10} {value}" for name, value in fields]
    out += ["", table(
        ["seq", "branch", "phase", "kind", "tier", "hash", "worker", "committed"],
        [[c["seq"], c["branch"], c["phase"], c["kind"], tier(c["tier"], c["tier_label"]),
          c["state_hash"][:12], c["worker_id"], c["created_at"]] for c in checkpoints],
        color=color) if checkpoints else "no checkpoints yet"]
    if include_state:
        out += [""] + [f"seq {c['seq']} ({c['kind']}): "
                       f"{json.dumps(c.get('state'), sort_keys=True)}" for c in checkpoints]
    if actions:
        out += ["", table(["action", "from", "seq", "reason", "by", "at"],
                          [[a["action"], a["from_status"], a["seq"], a["reason"], a["actor"],
                            a["created_at"]] for a in actions], color=color)]
    return "\n".join(out)


def action(result: dict[str, Any]) -> str:
    run = result["run"]
    line = f"{result['action']}: {run['workflow_id']} is now {run['status']}"
    if result.get("sent") is False:
        line += " (resume message queued in the outbox; the relay will send it)"
    return line


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
