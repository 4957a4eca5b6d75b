"""Does a knapsack solver of torch's partitioner keep its own memory limit? (pytorch/pytorch#197871's claim)

Below knob 1.0 the min-cut partitioner hands a knapsack (``activation_memory_budget_solver``:
``dp``, ``greedy``, ``ilp``, ``dp_knapsack_sliding_hirschberg``) the memory of each activation it
may choose to save and a limit (``max_memory``), in
``torch._functorch.partitioners._optimize_runtime_with_given_memory`` (torch/_functorch/partitioners.py:3338):
the solver returns the indices it saves. :func:`solver_limits` partitions a joint graph at each
knob with each solver, watching that call, and reports every choice whose saved memory exceeds the
limit the solver was given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..trace.torch_compile.partition import SOLVERS, partitioner_config


@contextlib.contextmanager
def _watched_knapsack(calls: list) -> Iterator[None]:
    from torch._functorch import partitioners

    original = partitioners._optimize_runtime_with_given_memory

    def watched(joint_graph, memory, runtimes, max_memory, *rest):
        result = original(joint_graph, memory, runtimes, max_memory, *rest)
        calls.append({"max_memory": float(max_memory), "items": len(memory),
                      "saved_memory": float(sum(memory[i] for i in result[1]))})
        return result

    partitioners._optimize_runtime_with_given_memory = watched
    try:
        yield
    finally:
        partitioners._optimize_runtime_with_given_memory = original


def _over(call: dict) -> bool:
    return call["saved_memory"] > call["max_memory"] * (1 + 1e-9) + 1e-9


def watched_peaks(joint, knob: float, *, solver: str | None = None, runtime_estimator: str | None = None,
                  cache=True) -> dict:
    """:func:`dtrlab.memory.partitioned.knob_peaks` under ``solver`` and ``runtime_estimator``, with the
    knapsack watched: ``knapsack_calls``, ``knapsack_over`` (calls whose choice saves more than their limit)
    and ``knapsack_worst`` (the largest saved memory over limit, 0 when the knapsack did not run). The census's
    evaluation for ``dtrlab knob --solver/--runtime-estimator``. ``cache``: knob_peaks's (Inductor's lowerings)."""
    from ..memory.partitioned import knob_peaks

    calls: list = []
    try:
        with partitioner_config(None, runtime_estimator=runtime_estimator), _watched_knapsack(calls):
            row = knob_peaks(joint, knob, solver=solver, cache=cache)
    except RuntimeError as exc:  # torch's own refusal, e.g. the ilp solver without scipy
        raise ValueError(f"activation_memory_budget_solver {solver or 'configured'}, estimator "
                         f"{runtime_estimator or 'configured'}: {str(exc).strip().splitlines()[0]}") from None
    ratios = [c["saved_memory"] / c["max_memory"] for c in calls if c["max_memory"] > 0]
    return {**row, "knapsack_calls": len(calls), "knapsack_over": sum(map(_over, calls)),
            "knapsack_worst": max(ratios, default=0.0)}


def solver_limits(joint, knobs, solvers=SOLVERS) -> list[dict]:
    """One row per (solver, knob, knapsack call): its limit, the memory its choice saves, and ``over``
    (saved memory above the limit, beyond float rounding). A solver this torch lacks, or one that fails
    (``ilp`` needs scipy), is a row with ``error``."""
    from ..trace.torch_compile.partition import partition

    rows = []
    for solver in solvers:
        for knob in knobs:
            calls: list = []
            try:
                with _watched_knapsack(calls):
                    partition(joint, knob, solver=solver, reuse_min_cuts=False)
            except Exception as exc:  # report a solver that cannot run here, do not stop the others
                rows.append({"solver": solver, "knob": knob, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
                continue
            rows += [{"solver": solver, "knob": knob, **call,
                      "over": _over(call)} for call in calls]
    return rows
