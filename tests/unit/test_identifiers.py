"""Every identifier check matches the whole text. A `$`-anchored pattern applied with
``re.match`` also matches before a final newline, so ``"abc\\n"`` passed as a workflow id,
a region or a role; SQS refuses such a message group id, so a run started that way could never
be sent. Each check now refuses a trailing newline like any other bad character."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from phasegate.access import AccessDenied, check_role
from phasegate.envelope import Envelope
from phasegate.orchestrator.starter import StartError, start_workflow
from phasegate.residency import ResidencyError, residency
from phasegate.schedules import ScheduleError, parse_schedules
from phasegate.workflow import Workflow, WorkflowDefinitionError


def envelope(**fields: Any) -> Envelope:
    return Envelope.model_validate_json(json.dumps(
        {"v": 1, "kind": "start", "workflow_id": "abc", "workflow": "wf", **fields}))


CHECKS: dict[str, tuple[Callable[[str], object], type[Exception]]] = {
    "envelope workflow_id": (lambda text: envelope(workflow_id=text), ValidationError),
    "envelope branch": (lambda text: envelope(branch=text), ValidationError),
    "workflow name": (lambda text: Workflow(text), WorkflowDefinitionError),
    "region": (lambda text: residency("internal", text), ResidencyError),
    "role": (check_role, AccessDenied),
    "schedule name": (lambda text: parse_schedules(json.dumps(
        [{"workflow": "wf", "name": text, "cron": "* * * * *"}])), ScheduleError),
}


@pytest.mark.parametrize("check", CHECKS)
def test_a_trailing_newline_is_refused(check: str) -> None:
    accept, error = CHECKS[check]
    accept("ok-name")  # the same text without the newline passes
    with pytest.raises(error):
        accept("ok-name\n")


async def test_start_refuses_a_workflow_id_with_a_trailing_newline() -> None:
    """Refused before the store or the queue is touched (neither is given)."""
    with pytest.raises(StartError, match="workflow id"):
        await start_workflow(None, None, workflow=Workflow("wf"),  # type: ignore[arg-type]
                             input={}, workflow_id="abc\n")
