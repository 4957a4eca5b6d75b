"""Exact rematerialization: the least recompute that fits a budget, checked in the simulator.

* :func:`solve_optimal` solves the stage formulation (:mod:`.model`) with OR-Tools
  CP-SAT or HiGHS and returns a :class:`SolveResult` with its :class:`Schedule`;
* :func:`replay` follows a schedule inside dtrlab's simulator, the independent check;
* :mod:`.frontier` bisects the minimal feasible budget per trace.

The solver packages are the optional extra ``dtrlab[solvers]``. See docs/solvers.md.
"""

from .problem import SCOPE_NOTE, Problem, Schedule, SolveResult, UnsupportedTrace, build_problem
from .replay import ReplayResult, ScriptedPolicy, replay
from .solve import DEFAULT_TIME_LIMIT_S, SOLVERS, SolverUnavailable, checked, solve_optimal

__all__ = [
    "SCOPE_NOTE", "Problem", "UnsupportedTrace", "checked", "build_problem", "ReplayResult", "ScriptedPolicy", "replay",
    "DEFAULT_TIME_LIMIT_S", "SOLVERS", "Schedule", "SolverUnavailable", "SolveResult", "solve_optimal",
]
