"""The feasibility frontier of one trace, bracketed from both sides.

* **Upper side (replayed):** the smallest budget at which some real run fits: a policy's
  passing run on a sweep grid (DTR, the zoo: simulator runs), DTR's run at a solved
  budget, or a stage-model or interval-model schedule that the simulator replays
  (:func:`.replay`). Nothing counts as feasible without a run in the simulator.
* **Lower side (proven):** the largest budget at which the relaxation (:mod:`.relax`),
  which every on-demand simulator run maps into, is infeasible: no such run fits there.
  Its optimum at sampled budgets bounds the compute of every run from below.

Every claim of the lower side is checked against every real run the frontier holds
(:func:`audit_rows`): a proof that a known run contradicts is a *solver fault* (column
``fault``, a :class:`SolverFaultWarning`), and the bracket ignores it; so is a solver
row whose reported recompute differs from its replay's.

What one frontier computes is a :class:`FrontierPlan`; :func:`compute_frontier` runs it
step by step (policy runs, stage model, interval model, relaxation). Each finished solve
can be handed to a :class:`SolveJournal` (one checksummed JSON file per solve, written
atomically), so an interrupted run resumes without repeating a finished solve. Results
are parquet files with their trace's content hash, :data:`FRONTIER_VERSION` and a
checksum of their content in the metadata, checked by :func:`read_frontier` before use.

Modules: :mod:`.plan` (the plan and its checks), :mod:`.result` (rows, the audit, the bracket:
:class:`Frontier`), :mod:`.steps` (:func:`compute_frontier` and its steps; :func:`load_frontiers`), :mod:`.store`
(frontier files and the solve journal). Every public name is importable from here.
"""

from .plan import STAGE_SOLVERS, FrontierPlan, PlanError
from .result import (COLUMNS, FRONTIER_VERSION, MODEL_OF, Frontier, RealRun, SolverFaultWarning, assemble, audit_rows,
                     real_runs)
from .steps import (compute_frontier, hole_budgets, load_frontiers, policy_rows, probe_interval_model,
                    probe_stage_model, prove_lower_side, run_policies, sampled_budgets)
from .store import SolveJournal, StaleFrontier, frontier_path, read_frontier, write_frontier

__all__ = [
    "COLUMNS", "FRONTIER_VERSION", "MODEL_OF", "STAGE_SOLVERS", "Frontier", "FrontierPlan", "PlanError", "RealRun",
    "SolveJournal", "SolverFaultWarning", "StaleFrontier", "assemble", "audit_rows", "compute_frontier",
    "frontier_path", "hole_budgets", "load_frontiers", "policy_rows", "probe_interval_model", "probe_stage_model",
    "prove_lower_side", "read_frontier", "real_runs", "run_policies", "sampled_budgets", "write_frontier",
]
