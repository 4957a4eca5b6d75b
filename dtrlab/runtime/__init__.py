"""The simulator: simrd-faithful DTR replay under a memory budget."""

from .baseline import Baseline, baseline
from .run import RunResult, budget_for, memory_label, simulate
from .semantics import (DEFAULT_OVERHEAD_LIMIT, FLAT, REFERENCE, Semantics, check_semantics, memory_spec,
                        refuse_loose)
from .simulator import (ALLOCATED, RESERVED, SEMANTICS, SIMULATOR_VERSION, Failure, Intervention, OutOfMemory, PlacementRequest, SimulationError,
                        Simulator, Thrash, recompute_allowance, remat_allowance)

__all__ = [
    "Baseline", "baseline", "DEFAULT_OVERHEAD_LIMIT", "RunResult", "budget_for", "simulate", "SIMULATOR_VERSION",
    "FLAT", "memory_label", "memory_spec", "PlacementRequest", "Failure", "Intervention", "OutOfMemory", "SimulationError", "Simulator", "Thrash",
    "check_semantics", "refuse_loose", "Semantics", "REFERENCE", "RESERVED", "ALLOCATED", "SEMANTICS",
    "recompute_allowance", "remat_allowance",
]
