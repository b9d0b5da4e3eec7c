"""Workflows of operators (sandbox tasks, inference calls, training steps) run by readiness
across pools, with cross-workflow reuse by ``H_task`` and per-workflow lineage."""

from .dag import CallOp, OpOutcome, OpRef, SandboxOp, Workflow, WorkflowRun

__all__ = ["CallOp", "OpOutcome", "OpRef", "SandboxOp", "Workflow", "WorkflowRun"]
