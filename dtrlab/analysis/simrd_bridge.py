"""Run simrd itself beside dtrlab, with the reference protocol, to check or chase a divergence.

simrd (uwsampl/dtr-prototype, folder ``simrd/``) is not part of dtrlab: point
:func:`load_simrd` at the folder of a checkout that holds the ``simrd`` package. The
protocol is that of ``../shared/reference/README.md``: the baseline from an unbounded
``RuntimeV1``, the budget ``int(peak * ratio)``, ``RuntimeV2EagerOptimized`` with
``remat_limit = baseline compute * (overhead_limit - 1)``, and the storages returned by
the heuristic's ``choose()`` recorded by their root tensor names.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class SimrdOutcome:
    status: str
    budget_bytes: int
    clock: int
    remat_compute: int
    peak_memory: int
    evicted_storages: tuple[str, ...]
    seconds: float  # the budgeted replay alone (not parsing or the baseline)
    cpu_seconds: float = 0.0  # the same, in this process's CPU time (steadier on a shared machine)

    @property
    def eviction_sha256(self) -> str:
        return hashlib.sha256("\n".join(self.evicted_storages).encode()).hexdigest()


def load_simrd(path: str | Path) -> ModuleType:
    """Import simrd (with its ablations) from ``path``, the folder holding the ``simrd`` package."""
    path = Path(path)
    if not (path / "simrd" / "runtime" / "v2.py").is_file():
        raise FileNotFoundError(f"{path} does not hold simrd (expected simrd/runtime/v2.py under it); "
                                "give the simrd/ folder of a uwsampl/dtr-prototype checkout")
    sys.path.insert(0, str(path))
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 100000))  # simrd recurses along remat chains
    import simrd.heuristic.ablation  # noqa: F401  (registers the ablations)
    import simrd.parse  # noqa: F401  (the submodules used below, through the package)
    import simrd.runtime  # noqa: F401
    return sys.modules["simrd"]


def run_simrd(simrd: ModuleType, log_path: str | Path, heuristic: str, *, ratio: float | None = None,
              budget_bytes: int | None = None, overhead_limit: float = 2.0) -> SimrdOutcome:
    """One simrd run of ``heuristic`` (a simrd class name such as ``DTR`` or ``AbESize``)."""
    with open(log_path) as handle:
        callback = simrd.parse.parse_file(handle, start=True).get_closure()
    unbounded = simrd.runtime.RuntimeV1(math.inf, simrd.heuristic.Heuristic(), stats=False, trace=False)
    callback(unbounded)
    if budget_bytes is None:
        budget_bytes = int(unbounded.telemetry.summary["max_memory"] * ratio)
    remat_limit = unbounded.telemetry.summary["model_compute"] * (overhead_limit - 1)

    policy = simrd.heuristic.HEURISTICS[heuristic]()
    evicted: list[str] = []
    choose = policy.choose

    def recording_choose(pool, rt, **kwargs):
        chosen = choose(pool, rt, **kwargs)
        evicted.extend(s.tensors[0].name for s in chosen)
        return chosen

    policy.choose = recording_choose
    runtime = simrd.runtime.RuntimeV2EagerOptimized(budget_bytes, policy, stats=False, trace=False,
                                                    remat_limit=remat_limit)
    started, started_cpu = time.perf_counter(), time.process_time()
    try:
        callback(runtime)
        status = "pass"
    except MemoryError:
        status = "oom"
    except simrd.runtime.RematExceededError:
        status = "thrash"
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - started_cpu
    summary = runtime.telemetry.summary
    return SimrdOutcome(status=status, budget_bytes=budget_bytes, clock=runtime.clock,
                        remat_compute=summary["remat_compute"], peak_memory=summary["max_memory"],
                        evicted_storages=tuple(evicted), seconds=seconds, cpu_seconds=cpu_seconds)
