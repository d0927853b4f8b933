"""The benchmark harness runs end to end on a tiny workload and produces every figure.

No timing is asserted: the figures only have to exist and be plausible numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.report import CONTINUATION, merged, render, targets, transition_targets
from bench.transition_runs import Workload
from bench.transition_summary import PER_RUN
from bench.transitions import bench

pytestmark = pytest.mark.slow
RESULT_PATH = Path(__file__).resolve().parents[2] / "bench" / "results" / "smoke.json"


async def test_harness_produces_every_figure(pg_server_dsn: str) -> None:
    result = await bench(quick=True, backends=["memory"], repeats=1, process_repeats=1,
                         server_dsn=pg_server_dsn,
                         workloads=[Workload("memory", 1, 4), Workload("memory", 2, 3)])
    result["command"] = "pytest"
    per = result["summary"]["per_workload"]
    assert set(per) == {"memory/1g", "memory/2g"}
    for row in per.values():
        # Postgres CPU too: counted in nanoseconds, so even a run of a few transitions has
        # some (in clock ticks the floor's read 0).
        for figure in (*PER_RUN, "pg_round_trips_per_transition",
                       "server_cpu_per_transition_us"):
            for system in ("floor", "phasegate"):
                value = row[figure][system]
                assert math.isfinite(value) and value > 0, (figure, system, value)
        # The commit is one statement, at most one per transition (group commit shares one
        # statement among concurrent commits).
        by_statement = row["pg_round_trips_per_transition"]["phasegate_by_statement"]
        commits = (by_statement.get("exec:commit_phase", 0.0)
                   + by_statement.get("exec:commit_phases", 0.0))
        assert 0 < commits <= 1.0
    for figure in ("idle_rss_mib", "cold_start_s", "failover_s"):
        for system in ("floor", "phasegate"):
            assert result["summary"]["processes"][figure][system] > 0
    text = render(result, RESULT_PATH)
    assert "## Targets" in text and "failover" in text
    assert targets(result["summary"])


def _cell(floor: float, phasegate: float) -> dict[str, float]:
    return {"floor": floor, "phasegate": phasegate, "ratio": phasegate / floor}


def test_every_transition_target_has_a_row_measured_or_pointed_elsewhere() -> None:
    row = {"transitions_per_s": _cell(100, 90), "cpu_per_transition_us": _cell(100, 200),
           "server_cpu_per_transition_us": _cell(100, 140), "wal_bytes_per_transition":
           _cell(1000, 3000), "sqs_calls_per_transition": _cell(3, 1),
           "pg_round_trips_per_transition": {"phasegate": 1.5}}
    summary = {"per_workload": {"memory/1g": row, "memory/16g": row,
                                "localstack/1g": {"latency_p50_ms": _cell(7, 14)}}}
    rows = transition_targets(summary, "python -m bench.transitions", {
        "localstack/1g": "python -m bench.transitions --backends localstack"})
    by = {(target, where): (measured, met, command) for target, measured, where, met, command
          in rows}
    assert by[("throughput ≥ 0.85x floor, continuation off", "memory/16g")][:2] == (
        "0.90x", "yes")
    assert by[("WAL bytes per transition ≤ 1.5x floor", "memory/1g")][:2] == ("3.00x", "**no**")
    assert by[("≤ 1 Postgres round trip per transition (average)", "memory/1g")][1] == "**no**"
    assert by[("moonshot: throughput ≥ 2x floor at 16 groups", "memory/16g")][1] == "**no**"
    wait = by[("wait between two phases on LocalStack ≤ 1.0x floor, continuation off",
               "localstack/1g")]
    assert wait == ("2.00x", "**no**", "python -m bench.transitions --backends localstack")
    pointed = [target for target, measured, *_ in rows if measured.startswith(CONTINUATION)]
    assert len(pointed) == 5  # throughput x2, SQS calls x2, LocalStack: continuation on


def test_the_round_trips_made_once_a_run_or_once_a_worker_are_named_beside_the_figure() -> None:
    counted = {"phasegate": 1.0013, "phasegate_by_statement": {
        "exec:continue_phase": 0.9993, "exec:commit_phase": 0.0007,
        "exec:start_and_load": 0.0007, "describe:start_and_load": 0.0003,
        "exec:-- A worker that stops cleanly (scale-in": 0.0007}}
    rows = transition_targets({"per_workload": {"memory/1g": {
        "pg_round_trips_per_transition": counted}}}, "cmd")
    by = {(target, where): measured for target, measured, where, *_ in rows}
    assert by[("≤ 1 Postgres round trip per transition (average)", "memory/1g")] == (
        "1.001 (of which a run's start 0.001, a worker's stop 0.001)")


def test_a_target_without_its_workload_says_so() -> None:
    rows = transition_targets({"per_workload": {}}, "cmd")
    assert all(measured in ("not measured in this run", CONTINUATION)
               or measured.startswith(CONTINUATION) for _, measured, *_ in rows)


def test_a_continuation_run_fills_the_continuation_targets(tmp_path: Path) -> None:
    row = {"transitions_per_s": _cell(100, 120), "cpu_per_transition_us": _cell(100, 110),
           "server_cpu_per_transition_us": _cell(100, 140), "wal_bytes_per_transition":
           _cell(1000, 3000), "sqs_calls_per_transition": _cell(3, 0.2),
           "pg_round_trips_per_transition": {"phasegate": 0.9}}
    off = {"command": "off", "continuation": False,
           "summary": {"per_workload": {"memory/1g": row, "memory/16g": row}}}
    on = {"command": "on", "continuation": True,
          "summary": {"per_workload": {"memory/1g": row, "memory/16g": row}}}
    paths = []
    for name, result in (("off", off), ("on", on)):
        path = tmp_path / f"{name}.json"
        path.write_text(__import__("json").dumps(result))
        paths.append(path)
    result = merged(paths)
    assert set(result["summary"]["per_workload"]) == {
        "memory/1g", "memory/16g", "memory/1g+cont", "memory/16g+cont"}
    rows = transition_targets(result["summary"], "off", result["extra_commands"])
    by = {(target, where): (measured, met, command) for target, measured, where, met, command
          in rows}
    assert by[("throughput ≥ 1.0x floor, continuation on", "memory/1g+cont")] == (
        "1.20x", "yes", "on")
    assert by[("≤ 0.5 SQS calls per transition with continuation (floor: 3)",
               "memory/16g+cont")][:2] == ("0.20", "yes")
    assert by[("throughput ≥ 0.85x floor, continuation off", "memory/1g")][2] == "off"
    # LocalStack was not run here: its continuation row still points elsewhere.
    assert by[("wait between two phases on LocalStack ≤ 0.3x floor, continuation on",
               "localstack/1g")][0] == CONTINUATION


def test_the_localstack_workloads_fill_the_same_targets_except_round_trips() -> None:
    row = {"transitions_per_s": _cell(100, 250), "cpu_per_transition_us": _cell(2000, 600),
           "server_cpu_per_transition_us": _cell(100, 160), "wal_bytes_per_transition":
           _cell(1000, 1400), "sqs_calls_per_transition": _cell(3, 0.1),
           "latency_p50_ms": _cell(7, 1)}
    per = {key: row for key in ("localstack/1g", "localstack/1g+cont", "localstack/16g",
                                "localstack/16g+cont")}
    rows = transition_targets({"per_workload": per}, "cmd")
    by = {(target, where): (measured, met) for target, measured, where, met, _ in rows}
    for key in ("localstack/1g", "localstack/16g"):
        assert by[("throughput ≥ 0.85x floor, continuation off", key)] == ("2.50x", "yes")
        assert by[("throughput ≥ 1.0x floor, continuation on", key + "+cont")] == (
            "2.50x", "yes")
        for where in (key, key + "+cont"):
            assert by[("client CPU per transition ≤ 1.15x floor", where)] == ("0.30x", "yes")
            assert by[("Postgres CPU per transition ≤ 1.5x floor", where)] == (
                "1.60x", "**no**")
            assert by[("WAL bytes per transition ≤ 1.5x floor", where)] == ("1.40x", "yes")
            # Round trips are counted in-process only.
            assert ("≤ 1 Postgres round trip per transition (average)", where) not in by
        assert by[("≤ 0.5 SQS calls per transition with continuation (floor: 3)",
                   key + "+cont")] == ("0.10", "yes")


def test_round_by_round_pairs_each_phasegate_round_with_the_floor_round_beside_it() -> None:
    from bench.report import _spread, round_ratios

    floor = [{"latency_p50_ms": 5.0}, {"latency_p50_ms": 10.0}, {"latency_p50_ms": 0.0}]
    ours = [{"latency_p50_ms": 4.0}, {"latency_p50_ms": 12.0}, {"latency_p50_ms": 3.0}]
    result = {"runs": {"localstack/1g/floor": floor, "localstack/1g/phasegate": ours}}
    ratios = round_ratios(result, "localstack/1g")
    # The third round's floor read zero: no ratio, rather than an infinite one.
    assert ratios["latency_p50_ms"] == [0.8, 1.2]
    assert _spread(ratios["latency_p50_ms"]) == "1.00 (0.80 to 1.20)"
    assert _spread([]) == "" and ratios["wal_bytes_per_transition"] == []
    # The ratio of medians can read under the floor while the rounds straddle it.
    assert _spread([0.88, 0.68, 1.24, 1.15, 0.63]) == "0.88 (0.63 to 1.24)"
