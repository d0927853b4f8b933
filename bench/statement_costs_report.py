"""The tables ``bench.statement_costs`` prints: each section's figures as markdown, and the
schema comparisons as per-round ratios of the newest schema over the one before.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.measured_statements import BATCH, COMMIT_CALLS, COMMIT_HOP, CONTINUE_HOP, LOAD
from bench.statement_schema_comparisons import CHAINS_BEFORE, POSITIONS_BEFORE, ROWS_BEFORE


def _paired(found: dict[str, list[dict[str, float]]], before: str,
            after: str = "newest", what: str = "schema") -> str:
    """Each figure at ``after`` over the same figure at ``before`` in the same round (labels
    end in ``, {what} {before}`` and ``, {what} {after}``), median over rounds: on a machine
    whose speed drifts between minutes, the rounds' own ratios hold steadier than the ratio
    of two medians."""
    lines = [f"| statement ({what} {after} ÷ {what} {before}, median of per-round ratios) | "
             "wall | client CPU | server CPU | WAL | rounds |", "|---|---:|---:|---:|---:|---:|"]
    suffix = f", {what} {before}"
    for label, old in found.items():
        if not label.endswith(suffix):
            continue
        new = found[label[:-len(suffix)] + f", {what} {after}"]
        cells = []
        for key in ("wall_us", "client_cpu_us", "server_cpu_us", "wal_bytes"):
            ratios = [n[key] / o[key] for o, n in zip(old, new, strict=True) if o.get(key)]
            cells.append(f"{statistics.median(ratios):.3f}" if ratios else "")
        lines.append(f"| {label[:-len(suffix)]} | {' | '.join(cells)} | {len(old)} |")
    return "\n".join(lines)


def _cache(report: dict[str, Any]) -> str:
    """Each pooler mode's medians, then each named mode over the default round by round."""
    lines = ["| one statement as a worker sends it, by pooler mode (interleaved rounds) "
             "| wall (µs) | client CPU (µs) | server CPU (µs) |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
              f"{v['server_cpu_us']:.0f} |" for label, v in report["cache"].items()]
    found = report["cache_rounds"]
    named = [mode for mode in ("pgbouncer", "none")
             if any(label.endswith(f", pooler {mode}") for label in found)]
    return "\n\n".join(["\n".join(lines), *(
        _paired(found, "transaction", mode, what="pooler") for mode in named)])


def markdown(report: dict[str, Any]) -> str:
    if "commits" in report and "driver" not in report:
        floor = report["commits"][next(iter(COMMIT_CALLS))]["wall_us"]
        lines = ["| one statement as a worker sends it, with its commit (interleaved rounds) "
                 "| wall (µs) | client CPU (µs) | server CPU (µs) | WAL (bytes) |",
                 "|---|---:|---:|---:|---:|"]
        lines += [f"| {label} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
                  f"{v['server_cpu_us']:.0f} | {v['wal_bytes']:.0f} |"
                  for label, v in report["commits"].items()]
        return "\n".join([*lines, "", f"floor wall: {floor:.0f} µs"])
    if "cache" in report:
        return _cache(report)
    if "rows" in report:
        return _paired(report["rows_rounds"], f"v{ROWS_BEFORE}")
    if "chains" in report:
        return _paired(report["chains_rounds"], f"v{CHAINS_BEFORE}")
    if "positions" in report:
        return _paired(report["positions_rounds"], f"v{POSITIONS_BEFORE}")
    for section, what in (("schemas", CONTINUE_HOP), ("loads", LOAD)):
        if section not in report:
            continue
        lines = [f"| {what}, by schema (interleaved rounds) | wall per call (µs) | "
                 "client CPU per call (µs) | server CPU per call (µs) | WAL per call (bytes) |",
                 "|---|---:|---:|---:|---:|"]
        lines += [f"| {label} | {v['wall_us']:.0f} | {v.get('client_cpu_us', 0):.0f} | "
                  f"{v.get('server_cpu_us', 0):.0f} | {v.get('wal_bytes', 0):.0f} |"
                  for label, v in report[section].items()]
        return "\n".join(lines)
    batched = ["", f"| continued hops committed {BATCH} per statement (interleaved rounds) "
               "| wall per hop (µs) | client CPU per hop (µs) | server CPU per hop (µs) |",
               "|---|---:|---:|---:|"]
    batched += [f"| {label} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
                f"{v['server_cpu_us']:.0f} |" for label, v in report["batches"].items()]
    if "driver" not in report:
        return "\n".join(batched[1:])
    lines = ["| one `SELECT length($1::text)` through asyncpg | client CPU (µs) | wall (µs) |",
             "|---|---:|---:|"]
    lines += [f"| {label} | {v['client_cpu_us']:.0f} | {v['wall_us']:.0f} |"
              for label, v in report["driver"].items()]
    lines += ["", "| statement, inside the server, each in its own transaction | µs |",
              "|---|---:|"]
    lines += [f"| {label} | {us:.0f} |" for label, us in report["server"].items()]
    lines += ["", f"| {COMMIT_HOP}, interleaved rounds | µs (median) |", "|---|---:|"]
    lines += [f"| {label} | {us:.0f} |" for label, us in report["checks"].items()]
    lines += ["", "| a continued hop inside the server, by schema (interleaved rounds) "
              "| µs (median) |", "|---|---:|"]
    lines += [f"| {label} | {us:.0f} |" for label, us in report["rules"].items()]
    floor = report["commits"][next(iter(COMMIT_CALLS))]["wall_us"]
    lines += ["", "| one hop's commit as a worker sends it, with its commit (interleaved rounds) "
              "| wall (µs) | client CPU (µs) | server CPU (µs) | floor wall ÷ wall |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {label} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
              f"{v['server_cpu_us']:.0f} | {floor / v['wall_us']:.2f} |"
              for label, v in report["commits"].items()]
    return "\n".join(lines + batched)
