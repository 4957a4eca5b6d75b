"""The simulator: simrd-faithful DTR replay under a memory budget."""

from .baseline import Baseline, baseline
from .run import (DEFAULT_OVERHEAD_LIMIT, FLAT, RunResult, budget_for, check_semantics, memory_label, memory_spec,
                  simulate)
from .semantics import REFERENCE, Semantics
from .simulator import (ALLOCATED, RESERVED, SEMANTICS, SIMULATOR_VERSION, Failure, Intervention, OutOfMemory, PlacementRequest, SimulationError,
                        Simulator, Thrash, recompute_allowance, remat_allowance)

__all__ = [
    "Baseline", "baseline", "DEFAULT_OVERHEAD_LIMIT", "RunResult", "budget_for", "simulate", "SIMULATOR_VERSION",
    "FLAT", "memory_label", "memory_spec", "PlacementRequest", "Failure", "Intervention", "OutOfMemory", "SimulationError", "Simulator", "Thrash",
    "check_semantics", "Semantics", "REFERENCE", "RESERVED", "ALLOCATED", "SEMANTICS",
    "recompute_allowance", "remat_allowance",
]
