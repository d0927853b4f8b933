"""``@record`` (phasegate/records.py): a frozen dataclass to mypy, built by assignment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from phasegate.queue import Received
from phasegate.records import record
from phasegate.store import RunPosition


@record
class Pair:
    left: int
    right: str = "r"


def test_a_record_compares_and_hashes_by_value_as_a_frozen_dataclass() -> None:
    assert Pair(1) == Pair(1, "r")
    assert Pair(1) != Pair(2)
    assert {Pair(1), Pair(1), Pair(2)} == {Pair(1), Pair(2)}
    assert repr(Pair(1)) == "Pair(left=1, right='r')"
    assert hash(Received("m", "r", "{}", "g", 1)) == hash(Received("m", "r", "{}", "g", 1))


def test_a_position_s_copies_keep_their_fields() -> None:
    position = RunPosition(
        workflow_id="w", workflow="wf", status="running", next_seq=3, base_seq=0,
        current_phase="b", schema_version=1, input_json="{}", attempts=2, epoch=0,
        state_json='{"a":1}', state_hash="h", state_version=1, progress_json="{}",
        signal_json='"s"')
    stripped = position.without_state()
    assert (stripped.state_json, stripped.progress_json, stripped.signal_json) == (None,) * 3
    assert (stripped.next_seq, stripped.attempts, stripped.current_phase) == (3, 2, "b")


def test_mypy_refuses_an_assignment_to_a_record_s_field(tmp_path: Path) -> None:
    source = tmp_path / "assigns.py"
    source.write_text(textwrap.dedent("""
        from phasegate.records import record

        @record
        class Point:
            x: int

        Point(1).x = 2
    """))
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
         str(tmp_path / "cache"), str(source)], capture_output=True, text=True, check=False)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert 'Property "x" defined in "Point" is read-only' in checked.stdout
