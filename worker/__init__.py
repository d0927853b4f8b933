"""phasegate worker: the runtime that runs phases, and the SDK workflows are written with."""

from worker.context import Context
from worker.workflow import NonRetryableError, Registry, Workflow, WorkflowDefinitionError

__all__ = ["Context", "NonRetryableError", "Registry", "Workflow", "WorkflowDefinitionError"]
