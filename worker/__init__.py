"""phasegate worker: the runtime that runs phases, and the SDK workflows are written with."""

from phasegate.context import Context
from phasegate.workflow import NonRetryableError, Registry, Workflow, WorkflowDefinitionError

__all__ = ["Context", "NonRetryableError", "Registry", "Workflow", "WorkflowDefinitionError"]
