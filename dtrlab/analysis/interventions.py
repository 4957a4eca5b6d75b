"""Single-tensor intervention search: which one storage, withheld, changes a failure?

For a failing run, re-run once per distinct storage the policy evicted, with that
storage withheld from the candidates (eager frees still apply), through the sweep
engine's backends. Each re-run is classified:

* ``rescued``: it passes at the same budget;
* ``kind changed``: it still fails, with the other kind (oom <-> thrash);
* ``failure moved``: it fails the same way at another schedule step;
* ``no change``: it fails the same way at the same step.

For a score policy, a re-run makes exactly the base run's decisions up to the
first one that chose the withheld storage (``identical_decisions``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..policies import get_policy
from ..runtime import FLAT, REFERENCE, RESERVED, Intervention, RunResult, Semantics, refuse_loose, simulate
from ..sweep.cache import default_cache_dir, policy_fingerprint
from ..sweep.engine import RunSpec, run_many
from ..sweep.execution import SERIAL, Execution
from ..sweep.tables import TableCache
from ..trace.model import Trace
from .divergence import identical_evictions

EFFECTS = ("rescued", "kind changed", "failure moved", "no change")


@dataclass(frozen=True)
class InterventionSearch:
    """The failing run and one row per withheld storage (in order of first eviction).

    ``table`` columns: ``storage_id``, ``storage`` (name), ``size``,
    ``times_evicted`` and ``first_evicted`` (eviction index) in the base run, then
    the re-run's ``status``, ``effect``, ``overhead``, ``clock``, ``evictions``,
    ``remats``, ``identical_decisions``, ``failure_kind``, ``failure_step`` and
    ``failure_step_delta`` (re-run minus base; positive = fails later).
    """

    trace: str
    base: RunResult
    table: pd.DataFrame

    @property
    def rescues(self) -> pd.DataFrame:
        return self.table[self.table["effect"] == "rescued"]

    @property
    def changes(self) -> pd.DataFrame:
        """Every re-run whose outcome differs from the base run's (rescues included)."""
        return self.table[self.table["effect"] != "no change"]

    def intervention(self, storage: str) -> Intervention:
        """The intervention of one row, e.g. to replay a rescue on its own."""
        rows = self.table[self.table["storage"] == storage]
        if rows.empty:
            raise ValueError(f"{storage} is not a storage the base run evicted; "
                             f"try one of {', '.join(self.table['storage'][:5])}")
        return Intervention(withhold=frozenset({int(rows["storage_id"].iloc[0])}))


def _effect(base: RunResult, run: RunResult) -> str:
    if run.passed:
        return "rescued"
    if run.status != base.status:
        return "kind changed"
    if run.failure.step != base.failure.step:
        return "failure moved"
    return "no change"


#: One row per withheld storage.
TABLE_COLUMNS = ["storage_id", "storage", "size", "times_evicted", "first_evicted", "status", "effect", "overhead",
                 "clock", "evictions", "remats", "identical_decisions", "failure_kind", "failure_step",
                 "failure_step_delta"]


def single_tensor_search(trace: Trace, policy="dtr", *, ratio: float | None = None, budget_bytes: int | None = None,
                         storages: list[str] | None = None, semantics: Semantics = REFERENCE,
                         execution: Execution = SERIAL.uncached, **policy_params) -> InterventionSearch:
    """Withhold each storage the failing run evicted, one at a time; see the module doc.

    Budget, policy and ``semantics`` arguments are those of :func:`~dtrlab.runtime.simulate`;
    ``execution`` that of :func:`~dtrlab.sweep.engine.run_many`, whose ``cache`` (False by
    default here; True: the default sweep cache directory, or a directory) reuses the table
    of an earlier identical search, or a shipped one (:class:`~dtrlab.sweep.tables.TableCache`);
    the base run is always simulated. ``storages`` restricts the search to these evicted
    storages (names), e.g. to recompute a sample of a cached table.
    """
    refuse_loose(policy_params)
    refuse_loose(policy_params, Execution, "execution")
    policy = get_policy(policy, **policy_params)
    semantics = semantics.normalized(policy)
    memory, memory_options, enforce = semantics.memory, semantics.options, semantics.enforce
    overhead_limit, cache = semantics.overhead_limit, execution.cache
    base = simulate(trace, policy, ratio=ratio, budget_bytes=budget_bytes, semantics=semantics)
    if base.passed:
        raise ValueError(f"{trace.name} passes under {policy.label} at {base.budget_bytes:,} bytes; the search "
                         "explains failures, so give a failing budget (e.g. a hole found by a sweep)")
    store = None
    if cache is not False and storages is None:
        store = TableCache(default_cache_dir() if cache is True else cache, trace, "single_tensor_search",
                           {"policy": policy_fingerprint(policy), "budget_bytes": base.budget_bytes,
                            "overhead_limit": float(overhead_limit),
                            # a model other than flat joins the key; flat keys stay as they were
                            **({"memory": memory, "memory_options": memory_options} if memory != FLAT else {}),
                            # so does a semantics other than the default
                            **({"enforce": enforce, "device_capacity": base.device_capacity}
                               if enforce != RESERVED else {})})
        table = store.load()
        if table is not None:
            return InterventionSearch(trace.name, base, table)
    index = {name: i for i, name in enumerate(trace.tensor_names)}
    first: dict[str, int] = {}
    times: dict[str, int] = {}
    for i, name in enumerate(base.evicted_storages):
        first.setdefault(name, i)
        times[name] = times.get(name, 0) + 1
    if storages is not None:
        unknown = sorted(set(storages) - set(first))
        if unknown:
            raise ValueError(f"{', '.join(unknown[:5])}: not evicted by the base run; the evicted storages are "
                             f"{', '.join(list(first)[:5])}, ...")
    storages = [name for name in first if storages is None or name in storages]
    specs = [RunSpec(base.budget_bytes, policy, semantics, Intervention(withhold=frozenset({index[name]})), ratio)
             for name in storages]
    runs = run_many(trace, specs, execution=execution, desc=f"withhold each of {len(specs)} storages")
    rows = []
    for name, run in zip(storages, runs):
        failure = run.failure
        s = index[name]
        rows.append({
            "storage_id": s, "storage": name, "size": trace.operators[trace.tensor_op[s]].sizes[trace.tensor_index[s]],
            "times_evicted": times[name], "first_evicted": first[name],
            "status": run.status, "effect": _effect(base, run), "overhead": run.overhead, "clock": run.clock,
            "evictions": run.evictions, "remats": run.remats,
            "identical_decisions": identical_evictions(base, run),
            "failure_kind": failure.kind if failure else None,
            "failure_step": failure.step if failure else None,
            "failure_step_delta": failure.step - base.failure.step if failure else None,
        })
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)  # columns even when the base run evicted nothing
    table["effect"] = pd.Categorical(table["effect"], categories=EFFECTS)
    for column in ("failure_step", "failure_step_delta"):
        table[column] = table[column].astype("Int64")
    if store:
        store.store(table)
    return InterventionSearch(trace.name, base, table)
