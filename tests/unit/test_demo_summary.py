"""The demo's summary counts the workers' per-phase log lines as the workers write them."""

from __future__ import annotations

import json
from pathlib import Path

from phasegate.demo import phase_outcomes
from phasegate.logs import render_json


def _line(**fields: object) -> str:
    """A line as a worker's JSON pipeline encodes it (phasegate/logs.py)."""
    return str(render_json(None, "info", {"level": "info", **fields}))


def test_phase_lines_are_counted_by_outcome_as_the_workers_encode_them(tmp_path: Path) -> None:
    (tmp_path / "worker-0.log").write_text("\n".join([
        _line(event="phase", phase="ingest", outcome="advanced", workflow_id="wf_a"),
        _line(event="phase", phase="publish", outcome="completed", workflow_id="wf_a"),
        _line(event="checkpoint_audit", phase="ingest", workflow_id="wf_a"),
        "Traceback (most recent call last): a line that is not JSON, naming \"phase\"",
    ]) + "\n")
    (tmp_path / "worker-1.log").write_text("\n".join([
        # The standard library's spacing, as an older release wrote it.
        json.dumps({"event": "phase", "outcome": "superseded", "phase": "enrich"}),
        _line(event="phase", phase="enrich", outcome="advanced")[:25],  # cut off by a kill
    ]))
    (tmp_path / "orchestrator.log").write_text(_line(event="phase", outcome="advanced") + "\n")
    assert '"event":"phase"' in _line(event="phase")  # compact: what the summary read wrong
    assert phase_outcomes(tmp_path) == {"advanced": 1, "completed": 1, "superseded": 1}
