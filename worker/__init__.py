"""phasegate's data plane: the runtime that receives phase messages, runs one phase and commits it.

Imports only the shared core (``phasegate.*``), never the control plane. Workflows are written
with the SDK face, ``from phasegate import Workflow, Context``.
"""
