"""Real execution: one training step on real tensors, under a budget, with the simulator's decisions.

A layer above ``runtime`` (it imports trace, memory, policies and runtime, and needs torch).
See docs/execute.md.
"""

from .runtime import Divergence, ExecutionError, Recomputation, UnsupportedOperator
from .step import (OPTIMIZERS, BudgetBelowMinimum, CapturedStep, ExecuteResult, MinimumBudget, StepValues,
                   capture_step, minimum_budget, reference_step, run_step)

__all__ = [
    "OPTIMIZERS", "BudgetBelowMinimum", "CapturedStep", "Divergence", "ExecuteResult", "ExecutionError",
    "MinimumBudget", "Recomputation", "StepValues", "UnsupportedOperator", "capture_step", "minimum_budget",
    "reference_step", "run_step",
]
