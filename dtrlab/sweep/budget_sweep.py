"""``sweep``: one trace, one policy, many budgets -> a pandas DataFrame (cached)."""

from __future__ import annotations

import json
import math
import os

import pandas as pd

from ..version import __version__
from ..policies import Policy, get_policy
from ..runtime import (FLAT, REFERENCE, SIMULATOR_VERSION, Intervention, RunResult, Semantics, baseline, budget_for,
                       refuse_loose)
from ..trace import Trace, load
from .cache import SweepCache, default_cache_dir
from .engine import RunSpec, iter_runs
from .execution import SERIAL, Execution

#: Results of runs under a memory model other than flat (empty under flat, whose
#: cached rows predate them): see :class:`~dtrlab.runtime.RunResult`.
MEMORY_COLUMNS = ["fragmentation_evictions", "peak_reserved_bytes", "peak_allocated_bytes", "fragmentation_at_peak",
                  "largest_free_block", "segments", "oom_cause"]
#: Columns of a sweep frame, in order. ``ratio`` is the requested ratio, or
#: ``budget_bytes / baseline peak`` when budgets were given in bytes.
COLUMNS = [
    "trace", "trace_hash", "policy", "policy_name", "policy_params", "ratio", "budget_bytes", "status",
    "overhead", "clock", "evictions", "remats", "peak_memory", "remat_compute", "model_compute",
    "baseline_memory", "baseline_compute", "overhead_limit", "withhold", "eviction_sha256", "wall_seconds",
    "dtrlab_version", "simulator_version", "memory", "memory_options", *MEMORY_COLUMNS, "enforce", "device_capacity",
]
#: The dtypes of a sweep frame's numeric columns that pandas would not infer (the rest it infers).
_DTYPES = {"budget_bytes": "int64", "clock": "int64", "evictions": "int64", "remats": "int64", "peak_memory": "int64",
           "remat_compute": "int64", "model_compute": "int64", "simulator_version": "int64",
           "fragmentation_evictions": "Int64", "peak_reserved_bytes": "Int64", "peak_allocated_bytes": "Int64",
           "fragmentation_at_peak": "float64", "largest_free_block": "Int64", "segments": "Int64"}
#: Columns that depend on the budget (the rest describe the configuration).
_RESULT_COLUMNS = ["budget_bytes", "status", "overhead", "clock", "evictions", "remats", "peak_memory",
                   "remat_compute", "model_compute", "eviction_sha256", "wall_seconds", "simulator_version"]


#: The most budgets one ratio grid (or census fill) may make: a grid beyond it is a
#: typo (a step of 1e-9) that would allocate until memory runs out or run for ever.
MAX_BUDGETS = 10**6


def parse_ratios(ratios) -> list[float]:
    """A list of ratios, ``"start:stop:step"`` (both ends included) or ``"0.25,0.5"``.

    The range gives ``start + (stop - start) * i / n`` for ``i = 0..n`` with
    ``n = round((stop - start) / step)``, so ``"0.05:1.0:0.005"`` is exactly the
    reference's ``0.05 + 0.95 * i / 190``. Every value must be finite and positive, and
    a range may make at most :data:`MAX_BUDGETS` ratios.
    """
    if isinstance(ratios, str) and ":" in ratios:
        try:
            start, stop, step = (float(x) for x in ratios.split(":"))
        except ValueError:
            raise ValueError(f"ratios must look like START:STOP:STEP, e.g. 0.05:1.0:0.005; got {ratios!r}") from None
        if not all(map(math.isfinite, (start, stop, step))):
            raise ValueError(f"ratios {ratios!r}: START, STOP and STEP must be finite numbers")
        if not (step > 0 and stop > start and start > 0):
            raise ValueError(f"ratios {ratios!r}: need STOP > START > 0 and STEP > 0, e.g. 0.05:1.0:0.005")
        steps = (stop - start) / step
        if not steps < MAX_BUDGETS or round(steps) + 1 > MAX_BUDGETS:  # `not <`: also an infinite quotient
            raise ValueError(f"ratios {ratios!r} make {_count(steps)} budgets, more than the "
                             f"{MAX_BUDGETS:,} allowed; take a larger STEP")
        n = round(steps)
        if n < 1:
            raise ValueError(f"ratios {ratios!r}: STEP is larger than STOP - START")
        return [start + (stop - start) * i / n for i in range(n + 1)]
    if isinstance(ratios, str):
        ratios = [r for r in ratios.split(",") if r.strip()]
    try:
        values = [float(r) for r in ratios]
    except (TypeError, ValueError):
        raise ValueError(f"ratios must be numbers such as 0.25,0.5 or a range 0.05:1.0:0.005; got {ratios!r}") \
            from None
    if not values:
        raise ValueError("no ratios given; pass a list such as [0.25, 0.5] or a range '0.05:1.0:0.005'")
    bad = [r for r in values if not (r > 0 and math.isfinite(r))]
    if bad:
        raise ValueError(f"ratios must be finite positive fractions of the baseline peak, got {bad[:5]}")
    return values


def _count(steps: float) -> str:
    """The number of budgets ``steps + 1`` for a message: exact when it can be, else as a power of ten."""
    return f"{round(steps) + 1:,}" if steps < 1e15 else ("infinitely many" if math.isinf(steps) else f"{steps:.3g}")


def resolve_trace(trace: Trace | str | os.PathLike) -> Trace:
    if isinstance(trace, Trace):
        return trace
    loaded = load(trace)
    if isinstance(loaded, dict):
        if len(loaded) != 1:
            raise ValueError(f"{trace} holds {len(loaded)} traces ({', '.join(loaded)}); sweep one at a time, "
                             "e.g. for t in dtrlab.trace.load_directory(dir).values(): dtrlab.sweep(t, ...)")
        (loaded,) = loaded.values()
    return loaded


def _result_row(result: RunResult, seconds: float) -> dict:
    row = {"budget_bytes": result.budget_bytes, "status": result.status, "overhead": result.overhead,
           "clock": result.clock, "evictions": result.evictions, "remats": result.remats,
           "peak_memory": result.peak_memory, "remat_compute": result.remat_compute,
           "model_compute": result.model_compute, "eviction_sha256": result.eviction_sha256,
           "wall_seconds": seconds, "simulator_version": SIMULATOR_VERSION}
    if result.memory != FLAT:  # flat rows stay as they were, so cached and shipped ones keep matching
        row.update({c: getattr(result, c) for c in MEMORY_COLUMNS if c != "oom_cause"})
        row["oom_cause"] = result.failure.cause if result.failure is not None else None
    return row


def sweep(trace: Trace | str | os.PathLike, policy: str | Policy | type[Policy] = "dtr", *, ratios=None,
          budgets=None, semantics: Semantics = REFERENCE, execution: Execution = SERIAL,
          intervention: Intervention | None = None, **policy_params) -> pd.DataFrame:
    """Simulate ``trace`` at many budgets; one DataFrame row per requested budget.

    Give ``ratios`` (a list or ``"start:stop:step"``; budgets are simrd's
    ``int(peak * ratio)``) or ``budgets`` in bytes. ``semantics`` (a
    :class:`~dtrlab.runtime.semantics.Semantics`) is every run's memory model, runtime
    semantics and overhead limit, as in :func:`~dtrlab.simulate` (a model instance stands
    for its name and options: every run builds its own; columns ``memory``,
    ``memory_options``, ``enforce``, ``device_capacity`` (the latter's label such as
    ``"1.25x"``) and ``overhead_limit``). ``overhead_limit=math.inf`` runs without a thrash
    limit (cached under its own key): a run then finishes or runs out of memory, and
    :func:`dtrlab.analysis.anatomy.outcomes_at` derives every limit from it.

    ``execution`` (a :class:`~dtrlab.sweep.execution.Execution`) says where runs go, as in
    :func:`~dtrlab.sweep.run_many` (``Execution(jobs=2)`` uses two local processes; a Dask
    client or scheduler address runs on that cluster), and whether they are cached:
    ``cache`` is True (the default directory, ``$DTRLAB_CACHE`` or ``~/.cache/dtrlab``), a
    directory, or False; cached budgets are not simulated again, and results are stored as
    they finish, so an interrupted sweep resumes where it stopped.
    """
    refuse_loose(policy_params)
    refuse_loose(policy_params, Execution, "execution")
    trace = resolve_trace(trace)
    policy = get_policy(policy, **policy_params)
    semantics = semantics.normalized(policy)
    if (ratios is None) == (budgets is None):
        raise ValueError("give exactly one of ratios= (e.g. '0.05:1.0:0.005' or [0.25, 0.5]) or budgets= (bytes)")
    peak = baseline(trace).peak_memory
    if ratios is not None:
        ratio_list = parse_ratios(ratios)
        budget_list = [budget_for(trace, r) for r in ratio_list]
    else:
        budgets = list(budgets)
        try:
            budget_list = [int(b) for b in budgets]  # inf raises OverflowError, nan ValueError
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"budgets must be finite byte counts, e.g. [500_000_000, 10**9]; got {budgets[:5]}") \
                from None
        if not budget_list or min(budget_list) < 0:
            raise ValueError("budgets must be a non-empty list of byte counts >= 0, e.g. [500_000_000, 10**9]")
        ratio_list = [b / peak for b in budget_list]

    store = None
    if execution.cache is not False:
        store = SweepCache(default_cache_dir() if execution.cache is True else execution.cache, trace, policy,
                           semantics, intervention)
    cached = store.load() if store else pd.DataFrame(columns=_RESULT_COLUMNS)
    if len(cached):  # only the rows asked for become dicts (a bisection round asks for a few of hundreds)
        cached = cached[cached["budget_bytes"].isin(budget_list)]
    done = {row["budget_bytes"]: row for row in cached.to_dict("records")}

    todo: dict[int, float] = {}
    for budget, ratio in zip(budget_list, ratio_list):
        if budget not in done and budget not in todo:
            todo[budget] = ratio if ratios is not None else None
    specs = [RunSpec(b, policy, semantics, intervention, r) for b, r in todo.items()]
    for i, result, seconds in iter_runs(trace, specs, execution=execution, desc=f"{trace.name} {policy.label}"):
        row = _result_row(result, seconds)
        done[result.budget_bytes] = row
        if store:
            store.append([row])
    # Only a finished sweep merges its parts: an interrupted one leaves them for the resumed sweep,
    # so a second Ctrl-C (timeout -s INT sends two) has no clean-up to cut short.
    if store:
        store.compact()

    config = {"trace": trace.name, "trace_hash": trace.content_hash, "policy": policy.label,
              "policy_name": policy.name, "policy_params": json.dumps(policy.params, sort_keys=True, default=repr),
              "baseline_memory": peak, "baseline_compute": baseline(trace).model_compute,
              "overhead_limit": float(semantics.overhead_limit),
              "withhold": json.dumps(sorted(intervention.withhold)) if intervention else "",
              "dtrlab_version": __version__, "memory": semantics.memory,
              "memory_options": json.dumps(semantics.options, sort_keys=True) if semantics.memory_options else "",
              "enforce": semantics.enforce, "device_capacity": semantics.device_capacity or ""}
    # Column by column, each typed as it is built (a frame of row dicts cast afterwards took several times longer,
    # and a census makes hundreds of these frames).
    values = {**{c: [v] * len(budget_list) for c, v in config.items()}, "ratio": ratio_list,
              **{c: [done[b][c] for b in budget_list] for c in _RESULT_COLUMNS},
              **{c: [done[b].get(c) for b in budget_list] for c in MEMORY_COLUMNS}}
    return pd.DataFrame({c: pd.array(values[c], dtype=_DTYPES[c]) if c in _DTYPES else values[c] for c in COLUMNS})

