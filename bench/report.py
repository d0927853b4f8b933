"""Render a ``bench/results/transitions-*.json`` file as ``docs/benchmarks.md``.

    python -m bench.report bench/results/transitions-....json [more.json ...]
        # rewrite docs/benchmarks.md; workloads of further files (a LocalStack run) are added
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
NARRATIVE = ROOT / "bench" / "benchmarks_notes.md"

FIGURES = {
    "cpu_per_transition_us": ("client CPU per transition (µs)", "{:.0f}"),
    "transitions_per_s": ("transitions/s", "{:.0f}"),
    "latency_p50_ms": ("transition latency p50 (ms)", "{:.2f}"),
    "latency_p99_ms": ("transition latency p99 (ms)", "{:.2f}"),
    "pg_round_trips_per_transition": ("Postgres round trips per transition", "{:.2f}"),
    "sqs_calls_per_transition": ("SQS API calls per transition", "{:.2f}"),
    "server_cpu_per_transition_us": ("Postgres CPU per transition (µs)", "{:.0f}"),
    "wal_bytes_per_transition": ("WAL bytes per transition", "{:.0f}"),
}
PROCESS_FIGURES = {
    "idle_rss_mib": ("idle worker RSS (MiB)", "{:.1f}"),
    "cold_start_s": ("cold start: process start → first phase committed (s)", "{:.2f}"),
    "failover_s": ("failover: SIGKILL mid-phase → phase resumed elsewhere (s)", "{:.2f}"),
}


CONTINUATION = "see Local continuation (Transitions, round by round)"


def _ratio(per: dict[str, Any], key: str, figure: str) -> float | None:
    cell = per.get(key, {}).get(figure)
    return None if cell is None else float(cell["ratio"])


CONTINUED = "+cont"  # the suffix of a workload measured with local continuation on

# Statements made once a run or once a worker, not once a hop: the share of the round trips
# per transition they make, named beside the figure (the counting pass labels a statement by
# its query name, or by its first characters when it has none).
ONCE_EACH = {"start_and_load": "a run's start", "start_keyed_and_load": "a run's start",
             "-- A worker that stops cleanly": "a worker's stop"}


def _once_each(counted: dict[str, Any]) -> str:
    """`` (of which a run's start 0.001, a worker's stop 0.001)`` from a counting pass's
    statements, or "" when none of them was counted."""
    shares: dict[str, float] = {}
    for label, per_transition in counted.get("phasegate_by_statement", {}).items():
        statement = label.partition(":")[2]
        for prefix, what in ONCE_EACH.items():
            if statement.startswith(prefix):
                shares[what] = shares.get(what, 0.0) + per_transition
    if not shares:
        return ""
    named = [f"{what} {shares[what]:.3f}" for what in dict.fromkeys(ONCE_EACH.values())
             if what in shares]
    return " (of which " + ", ".join(named) + ")"


def transition_targets(summary: dict[str, Any], command: str,
                       extra_commands: dict[str, str] | None = None
                       ) -> list[tuple[str, str, str, str, str]]:
    """(target, measured, where, met, command) for EVERY target of the transition; a target
    measured with local continuation on reads the workload ``<key>+cont`` (a results file run
    with ``--continuation on``, added by ``merged``); without it the row says where to look."""
    per = summary["per_workload"]
    commands = extra_commands or {}
    rows: list[tuple[str, str, str, str, str]] = []

    def add(target: str, value: float | None, where: str, bound: float, fmt: str,
            above: bool = False, note: str = "") -> None:
        if value is None:
            rows.append((target, "not measured in this run", where, "?",
                         commands.get(where.split()[0], command)))
            return
        met = value >= bound if above else value <= bound
        rows.append((target, fmt.format(value) + note, where, "yes" if met else "**no**",
                     commands.get(where.split()[0], command)))

    def continued(target: str, key: str, figure: str, bound: float, fmt: str,
                  above: bool = False, value_of: str = "ratio", note: str = "") -> None:
        if key + CONTINUED in per:
            cell = per[key + CONTINUED].get(figure)
            add(target, None if cell is None else float(cell[value_of]), key + CONTINUED,
                bound, fmt, above)
        else:
            rows.append((target, CONTINUATION + note, key, "?", "—"))

    for key in ("memory/1g", "memory/16g"):
        add("throughput ≥ 0.85x floor, continuation off",
            _ratio(per, key, "transitions_per_s"), key, 0.85, "{:.2f}x", above=True)
        continued("throughput ≥ 1.0x floor, continuation on", key, "transitions_per_s", 1.0,
                  "{:.2f}x", above=True)
    add("moonshot: throughput ≥ 2x floor at 16 groups",
        _ratio(per, "memory/16g", "transitions_per_s"), "memory/16g", 2.0, "{:.2f}x",
        above=True)
    if "memory/16g" + CONTINUED in per:
        add("moonshot: throughput ≥ 2x floor at 16 groups",
            _ratio(per, "memory/16g" + CONTINUED, "transitions_per_s"),
            "memory/16g" + CONTINUED, 2.0, "{:.2f}x", above=True)
    def costs(key: str, in_process: bool) -> None:
        """The cost targets of ``key`` and its ``+cont`` run; an in-process workload missing
        from the results says so, a LocalStack one is left out (round trips are counted
        in-process only)."""
        for where in (key, key + CONTINUED):
            if where not in per and (where != key or not in_process):
                continue
            add("client CPU per transition ≤ 1.15x floor",
                _ratio(per, where, "cpu_per_transition_us"), where, 1.15, "{:.2f}x")
            add("Postgres CPU per transition ≤ 1.5x floor",
                _ratio(per, where, "server_cpu_per_transition_us"), where, 1.5, "{:.2f}x")
            add("WAL bytes per transition ≤ 1.5x floor",
                _ratio(per, where, "wal_bytes_per_transition"), where, 1.5, "{:.2f}x")
            if in_process:
                counted = per.get(where, {}).get("pg_round_trips_per_transition")
                add("≤ 1 Postgres round trip per transition (average)",
                    counted["phasegate"] if counted else None, where, 1.0, "{:.3f}",
                    note=_once_each(counted or {}))
        if not in_process and key + CONTINUED not in per:
            return
        calls = per.get(key, {}).get("sqs_calls_per_transition")
        continued("≤ 0.5 SQS calls per transition with continuation (floor: 3)", key,
                  "sqs_calls_per_transition", 0.5, "{:.2f}", value_of="phasegate",
                  note=(f" (continuation off: {calls['phasegate']:.2f})" if calls else ""))

    for key in ("memory/1g", "memory/16g"):
        costs(key, in_process=True)
    add("wait between two phases on LocalStack ≤ 1.0x floor, continuation off",
        _ratio(per, "localstack/1g", "latency_p50_ms"), "localstack/1g", 1.0, "{:.2f}x")
    continued("wait between two phases on LocalStack ≤ 0.3x floor, continuation on",
              "localstack/1g", "latency_p50_ms", 0.3, "{:.2f}x")
    # The same targets where every SQS call is an HTTP request to an SQS server, as in a
    # deployment: each costs the worker CPU that the in-process FIFO does not.
    for key in ("localstack/1g", "localstack/16g"):
        if key in per:
            add("throughput ≥ 0.85x floor, continuation off",
                _ratio(per, key, "transitions_per_s"), key, 0.85, "{:.2f}x", above=True)
        if key + CONTINUED in per:
            continued("throughput ≥ 1.0x floor, continuation on", key, "transitions_per_s",
                      1.0, "{:.2f}x", above=True)
        costs(key, in_process=False)
    return rows


def targets(summary: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(target, measured, where, met) for the older targets measured here (the transition's
    are in ``transition_targets``)."""
    rows: list[tuple[str, str, str, bool]] = []
    per = summary["per_workload"]
    for key in ("memory/1g", "memory/16g"):
        counted = per.get(key, {}).get("pg_round_trips_per_transition")
        if counted:
            by = counted["phasegate_by_statement"]
            commits = sum(by.get(f"exec:{name}", 0.0) for name in (
                "commit_phase", "commit_phases", "advance_phase", "continue_phase",
                "continue_phases"))
            rows.append(("at most one Postgres round trip per commit",
                         f"{commits:.2f} commit statements per transition, each one "
                         "statement (checkpoint + run + outbox, for one or many runs)", key,
                         commits <= 1.0 + 0.01))
    # In-process an SQS call completes without suspending its caller, so no two sends (or
    # deletes) are ever in flight together for the batcher to join; over HTTP they are.
    for key in ("memory/16g", "localstack/16g"):
        if key in per:
            calls = per[key]["sqs_calls_per_transition"]["phasegate"]
            rows.append(("≤ 1.3 SQS calls per transition under load", f"{calls:.2f}", key,
                         calls <= 1.3))
    processes = summary["processes"]
    if not measured_processes(summary):
        return rows
    rss = processes["idle_rss_mib"]["phasegate"]
    rows.append(("idle RSS ≤ 80 MiB", f"{rss:.1f} MiB", "phasegate worker process", rss <= 80))
    failover = processes["failover_s"]
    heartbeat = failover["settings"]["phasegate"]["heartbeat_s"]
    rows.append((f"failover ≤ 2x heartbeat ({2 * heartbeat:g} s)",
                 f"median {failover['phasegate']:.2f} s, max {failover['phasegate_max']:.2f} s",
                 "moto, 2 worker processes", failover["phasegate"] <= 2 * heartbeat))
    cold = processes["cold_start_s"]["phasegate"]
    rows.append(("cold start ≤ 1.5 s", f"{cold:.2f} s", "moto", cold <= 1.5))
    return rows


def measured_processes(summary: dict[str, Any]) -> bool:
    """False for a run with --skip-processes (its process figures are placeholders)."""
    return bool(summary["processes"]["cold_start_s"]["phasegate"])


def _cpus(cpus: list[int]) -> str:
    return ", ".join(str(cpu) for cpu in cpus)


def render(result: dict[str, Any], source: Path) -> str:
    summary = result["summary"]
    m = result["machine"]
    pg = result.get("postgres", {})
    out = [
        "# Benchmarks: phasegate against a raw floor",
        "",
        "<!-- Generated by `python -m bench.report` from "
        f"`{source.relative_to(ROOT)}`; the notes come from `bench/benchmarks_notes.md`. -->",
        "",
        f"Command: `{result['command'].strip()}` (results: `{source.relative_to(ROOT)}`, "
        f"taken {result['when']}).",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), {m['platform']}, Python {m['python']}; "
        f"PostgreSQL {pg.get('server_version', '?')} on 127.0.0.1 (fsync={pg.get('fsync', '?')}, "
        f"synchronous_commit={pg.get('synchronous_commit', '?')}, full_page_writes="
        f"{pg.get('full_page_writes', '?')}), "
        + ("a private cluster started for the run (so the WAL position moves only with the "
           "run's own writes), " if result.get("private_server") else "")
        + "a fresh database per run"
        + (f" holding {result['history_runs']:,} finished runs, analyzed (a database in use)"
           if result.get("history_runs") else "")
        + "; moto server in its own process"
        + (f"; Postgres kept to CPU {_cpus(result['cores']['server'])} and the benchmark "
           f"to CPU {_cpus(result['cores']['client'])} (`--cores split`: each side on a core "
           "of its own, as a deployment runs them on separate machines)"
           if isinstance(result.get("cores"), dict) else "")
        + ". "
        + _load_sentence(result)
        + ": floor and phasegate runs alternate and every figure is the median of "
        f"{result['repeats']} runs each "
        + (f"({result['process_repeats']} for the process figures), "
           if measured_processes(summary) else "(process figures not measured in this run), ")
        + "so the load hits both. Read the ratios, not the absolute rates. Concurrency "
        f"{result['concurrency']} for phasegate; the floor runs one poller per group.",
        "",
        "## Targets",
        "",
        "Ratios are phasegate ÷ the floor of the same run (medians). A `+cont` workload ran "
        "with local continuation on (`--continuation on`), the others with it off; a cell "
        "without a `+cont` run points to the Local continuation section. `memory/*` rows: the "
        "in-process FIFO, where an SQS call costs next to nothing, so the floor is a Postgres "
        "commit and little else. `localstack/*` rows: the same targets where every SQS call "
        "is an HTTP request to an SQS server (LocalStack, on the same two cores), as in a "
        "deployment, where each call costs the worker about a millisecond of CPU "
        "(\"Every target by shape\", further down).",
        "",
        "| target | measured | where | met | command |",
        "|---|---|---|---|---|",
    ]
    labels: dict[str, str] = {}
    for target, measured, where, met18, command in transition_targets(
            summary, result["command"].strip(), result.get("extra_commands")):
        if command != "—":
            command = labels.setdefault(command, f"[{len(labels) + 1}]")
        out.append(f"| {target} | {measured} | {where} | {met18} | {command} |")
    out += [""] + [f"{label} `{command}`  " for command, label in labels.items()]
    out += ["", "## Other targets", "", "| target | measured | where | met |",
            "|---|---|---|---|"]
    for target, measured, where, met in targets(summary):
        out.append(f"| {target} | {measured} | {where} | {'yes' if met else '**no**'} |")
    old = any("floor16" in row.get("transitions_per_s", {})
              for row in summary["per_workload"].values())
    out += ["", "## Every figure, phasegate ÷ floor in the same run", ""]
    if old:
        out += ["The old floor (16 pollers whatever the number of groups, as in the first "
                "benchmarks) ran in the same rounds: its idle pollers inflate its CPU at one "
                "group.",
                ""]
    out += ["`round by round`: each phasegate round ÷ the floor round of the same minute (the "
            "rounds alternate), median and range: how far a server that drifts between rounds "
            "moves the figure.",
            "",
            "| workload | figure | floor | phasegate | phasegate ÷ floor | round by round |"
            + (" old floor (16 pollers) |" if old else ""),
            "|---|---|---:|---:|---:|---|" + ("---:|" if old else "")]
    for key, row in summary["per_workload"].items():
        label = (f"{key} ({row['groups']} group{'s' if row['groups'] > 1 else ''} x "
                 f"{row['phases']} phases)")
        for figure, (name, fmt) in FIGURES.items():
            if figure not in row:
                continue
            cell = row[figure]
            extra = (f" {fmt.format(cell['floor16'])} |" if "floor16" in cell
                     else " |" if old else "")
            out.append(f"| {label} | {name} | {fmt.format(cell['floor'])} | "
                       f"{fmt.format(cell['phasegate'])} | {cell['ratio']:.2f} | "
                       f"{_spread(row.get('rounds', {}).get(figure))} |{extra}")
    if measured_processes(summary):
        for figure, (name, fmt) in PROCESS_FIGURES.items():
            cell = summary["processes"][figure]
            out.append(f"| worker processes | {name} | {fmt.format(cell['floor'])} | "
                       f"{fmt.format(cell['phasegate'])} | {cell['ratio']:.2f} | |"
                       + (" |" if old else ""))
        failover = summary["processes"]["failover_s"]["settings"]
        out += [
            "",
            "Failover settings: phasegate visibility "
            f"{failover['phasegate']['visibility_timeout_s']} s, heartbeat "
            f"{failover['phasegate']['heartbeat_s']:g} s; the floor has no heartbeat, so its "
            f"visibility ({failover['floor']['visibility_timeout_s']} s) must outlast its "
            f"longest phase ({failover['phase_s']:g} s). The kill lands at a random point of "
            "the heartbeat cycle."]
    out += [
        "",
        "## Postgres round trips per transition, by statement (counting pass)",
        "",
        "| workload | system | statement | per transition |",
        "|---|---|---|---:|",
    ]
    for key, row in summary["per_workload"].items():
        counted = row.get("pg_round_trips_per_transition")
        if not counted:
            continue
        for system in ("floor", "phasegate"):
            for statement, value in counted[f"{system}_by_statement"].items():
                if value >= 0.005:
                    out.append(f"| {key} | {system} | `{statement}` | {value:.3f} |")
    if NARRATIVE.exists():
        out += ["", NARRATIVE.read_text().rstrip()]
    return "\n".join(out) + "\n"


def _load_sentence(result: dict[str, Any]) -> str:
    load = result.get("load")
    if not load:
        return "Other work may have run on the same cores during the run"
    if max(load) < 4.0:
        return (f"Nothing else ran on the machine (load average {load[0]:.1f} at the run's end: "
                "the benchmark's own processes)")
    return (f"Other work ran on the same {result['machine']['cpus']} cores during the run (load "
            f"average {load[0]:.1f} at its end)")


def write_docs(result: dict[str, Any], source: Path) -> None:
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(render(result, source))
    print(f"wrote {DOCS.relative_to(ROOT)}")


def merged(paths: list[Path]) -> dict[str, Any]:
    """The first results file, with the workloads of the others added (a LocalStack run, a
    run with continuation on, made separately); each added workload keeps the command that
    measured it. Workloads of a file run with continuation on are named ``<key>+cont``."""
    result: dict[str, Any] = json.loads(paths[0].read_text())
    result["summary"]["per_workload"] = _named(result)
    extra_commands: dict[str, str] = {}
    for path in paths[1:]:
        other = json.loads(path.read_text())
        for key, row in _named(other).items():
            if key not in result["summary"]["per_workload"]:
                result["summary"]["per_workload"][key] = row
                extra_commands[key] = other["command"].strip()
    result["extra_commands"] = extra_commands
    return result


def round_ratios(result: dict[str, Any], key: str) -> dict[str, list[float]]:
    """Per figure, each round's phasegate ÷ the same round's floor (rounds alternate, so a
    pair ran minutes, not the whole run, apart); rounds with a zero floor are left out."""
    runs = result.get("runs", {})
    floor, ours = runs.get(f"{key}/floor", []), runs.get(f"{key}/phasegate", [])
    ratios: dict[str, list[float]] = {}
    for figure in FIGURES:
        pairs = zip(floor, ours, strict=False)
        ratios[figure] = [b[figure] / a[figure] for a, b in pairs
                          if a.get(figure) and b.get(figure) is not None]
    return ratios


def _spread(ratios: list[float] | None) -> str:
    if not ratios:
        return ""
    return f"{median(ratios):.2f} ({min(ratios):.2f} to {max(ratios):.2f})"


def _named(result: dict[str, Any]) -> dict[str, Any]:
    per: dict[str, Any] = result["summary"]["per_workload"]
    for key, row in per.items():
        row["rounds"] = round_ratios(result, key)
    if not result.get("continuation"):
        return per
    return {(key if key.endswith(CONTINUED) else key + CONTINUED): row for key, row in per.items()}


if __name__ == "__main__":
    paths = [Path(arg).resolve() for arg in sys.argv[1:]]
    write_docs(merged(paths), paths[0])
