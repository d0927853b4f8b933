"""The benchmark harness runs end to end on a tiny workload and produces every figure.

No timing is asserted: the figures only have to exist and be plausible numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.report import render, targets
from bench.transitions import PER_RUN, Workload, bench

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
        for figure in (*PER_RUN, "pg_round_trips_per_transition"):
            for system in ("floor", "phasegate"):
                value = row[figure][system]
                assert math.isfinite(value) and value > 0, (figure, system, value)
        # The commit is one statement, executed once per transition.
        by_statement = row["pg_round_trips_per_transition"]["phasegate_by_statement"]
        assert by_statement["exec:commit_phase"] == 1.0
    for figure in ("idle_rss_mib", "cold_start_s", "failover_s"):
        for system in ("floor", "phasegate"):
            assert result["summary"]["processes"][figure][system] > 0
    text = render(result, RESULT_PATH)
    assert "## Targets" in text and "failover" in text
    assert targets(result["summary"])
