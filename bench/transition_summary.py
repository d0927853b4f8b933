"""The results document's summary and its table: every figure's median per workload and
system, phasegate over the floor (``summarise``), and the table printed after a run
(``render_table``).
"""

from __future__ import annotations

from typing import Any

from bench.common import median
from bench.transition_processes import (
    FAILOVER_HEARTBEAT_S,
    FAILOVER_VISIBILITY_S,
    FLOOR_FAILOVER_VISIBILITY_S,
)
from bench.transition_runs import Env, Workload
from bench.workload import FAILOVER_PHASE_S

PER_RUN = ("cpu_per_transition_us", "transitions_per_s", "latency_p50_ms", "latency_p99_ms",
           "sqs_calls_per_transition")
# Postgres' side: exact on the private cluster (the default); on a shared server the WAL
# position also moves with other clients' writes.
SERVER = ("server_cpu_per_transition_us", "wal_bytes_per_transition",
          "server_cpu_ticks_per_transition_us")


def ratio(ours: float, floor: float) -> float:
    return ours / floor if floor else float("nan")


def summarise(env: Env, workloads: list[Workload], round_trips: dict[str, Any],
              processes: dict[str, Any], fail: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for workload in workloads:
        row: dict[str, Any] = {"transitions": workload.transitions, "phases": workload.phases,
                               "groups": workload.groups}
        old = env.runs.get(f"{workload.key}/floor16")
        for figure in (*PER_RUN, *SERVER):
            floor = median([r[figure] for r in env.runs[f"{workload.key}/floor"]])
            ours = median([r[figure] for r in env.runs[f"{workload.key}/phasegate"]])
            row[figure] = {"floor": floor, "phasegate": ours, "ratio": ratio(ours, floor)}
            if old:
                row[figure]["floor16"] = median([r[figure] for r in old])
        counted = round_trips.get(workload.key)
        if counted:
            floor = counted["floor"]["round_trips_per_transition"]
            ours = counted["phasegate"]["round_trips_per_transition"]
            row["pg_round_trips_per_transition"] = {
                "floor": floor, "phasegate": ours, "ratio": ratio(ours, floor),
                "phasegate_by_statement": counted["phasegate"]["by_statement_per_transition"],
                "floor_by_statement": counted["floor"]["by_statement_per_transition"]}
        table[workload.key] = row
    single: dict[str, Any] = {}
    for figure in ("cold_start_s", "idle_rss_mib"):
        floor = median([r[figure] for r in processes["floor"]])
        ours = median([r[figure] for r in processes["phasegate"]])
        single[figure] = {"floor": floor, "phasegate": ours, "ratio": ratio(ours, floor)}
    floor, ours = median(fail["floor"]), median(fail["phasegate"])
    single["failover_s"] = {
        "floor": floor, "phasegate": ours, "ratio": ratio(ours, floor),
        "phasegate_max": max(fail["phasegate"]), "floor_max": max(fail["floor"]),
        "settings": {"phasegate": {"visibility_timeout_s": FAILOVER_VISIBILITY_S,
                                   "heartbeat_s": FAILOVER_HEARTBEAT_S},
                     "floor": {"visibility_timeout_s": FLOOR_FAILOVER_VISIBILITY_S,
                               "heartbeat": None},
                     "phase_s": FAILOVER_PHASE_S}}
    return {"per_workload": table, "processes": single}


def render_table(result: dict[str, Any]) -> str:
    lines = ["| workload | figure | floor | phasegate | ratio |", "|---|---|---:|---:|---:|"]
    for key, row in result["summary"]["per_workload"].items():
        for figure in (*PER_RUN, *SERVER, "pg_round_trips_per_transition"):
            if figure in row:
                cell = row[figure]
                lines.append(f"| {key} | {figure} | {cell['floor']:.3g} | "
                             f"{cell['phasegate']:.3g} | {cell['ratio']:.2f} |")
    for figure, cell in result["summary"]["processes"].items():
        lines.append(f"| process | {figure} | {cell['floor']:.3g} | {cell['phasegate']:.3g} | "
                     f"{cell['ratio']:.2f} |")
    return "\n".join(lines)
