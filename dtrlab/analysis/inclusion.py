"""The inclusion property, checked empirically.

A stack algorithm (Mattson et al. 1970) keeps, at every moment, a subset of what it
would keep with more memory; that is why LRU caches show no Belady anomaly. For a
rematerialization policy the analogue is: after every schedule step, each storage
resident at the smaller budget is also resident at the larger one.

:func:`inclusion` replays the same trace and policy at two budgets in lockstep, one
schedule step at a time, compares the resident storages after every step, and
relates the violations to the failure that may follow. Sets are compared at step
boundaries, so a storage evicted and rematerialized within one step is not seen.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..policies import Policy, get_policy
from ..runtime import REFERENCE, Failure, OutOfMemory, Semantics, Simulator, Thrash, baseline, budget_for
from ..sweep.execution import SERIAL, Execution
from ..trace.model import Trace


@dataclass(frozen=True)
class InclusionResult:
    """Where the run at ``budget_small`` holds a storage that the run at ``budget_large`` does not.

    ``violation_counts[k]`` is the number of such storages after schedule step ``k``,
    for the ``steps_compared`` steps both runs completed. ``episodes`` lists each
    violation as a storage and the steps it lasted (one row per maximal run of
    steps); together they name every violating (step, storage) pair.
    ``held_remats`` lists every storage the large run rematerialized while the small
    run held it (it was a violation just before that step), with the storage's
    compute. ``remat_small``/``remat_large`` are the runs' cumulative
    rematerialization compute after each compared step.
    """

    trace: str
    policy: str
    budget_small: int
    budget_large: int
    status_small: str
    status_large: str
    failure_small: Failure | None
    failure_large: Failure | None
    steps_compared: int
    violation_counts: np.ndarray
    episodes: pd.DataFrame
    held_remats: pd.DataFrame
    remat_small: np.ndarray
    remat_large: np.ndarray
    remat_limit: float

    @property
    def holds(self) -> bool:
        """No violation at any compared step."""
        return not self.violation_counts.any()

    @property
    def violating_steps(self) -> np.ndarray:
        """Every schedule step after which some storage is resident at the small budget only."""
        return np.flatnonzero(self.violation_counts)

    @property
    def first_violation_step(self) -> int | None:
        steps = self.violating_steps
        return int(steps[0]) if len(steps) else None

    @property
    def failing_run(self) -> str | None:
        """``"small"``, ``"large"`` or ``"both"``: the run(s) that failed first; None when both pass."""
        steps = {name: f.step for name, f in (("small", self.failure_small), ("large", self.failure_large)) if f}
        if not steps:
            return None
        first = min(steps.values())
        failed = [name for name, step in steps.items() if step == first]
        return failed[0] if len(failed) == 1 else "both"

    @property
    def failure_step(self) -> int | None:
        """The step of the first failure in either run."""
        steps = [f.step for f in (self.failure_small, self.failure_large) if f]
        return min(steps) if steps else None

    @property
    def held_remat_compute(self) -> int:
        """Compute of the storages the large run rematerialized while the small run held them."""
        return int(self.held_remats["compute"].sum())

    @property
    def anomaly(self) -> bool:
        """The larger budget fails although the smaller one passes (a Belady-style anomaly)."""
        return self.status_small == "pass" and self.status_large != "pass"

    def summary(self) -> str:
        """A few sentences for a notebook or the command line."""
        head = (f"{self.trace} {self.policy}: budgets {self.budget_small} ({self.status_small}) and "
                f"{self.budget_large} ({self.status_large}), {self.steps_compared} steps compared")
        if self.holds:
            return head + "; inclusion holds at every step."
        text = (f"{head}; inclusion is violated after {len(self.violating_steps)} steps, first at step "
                f"{self.first_violation_step}, at most {int(self.violation_counts.max())} storages at once "
                f"({len(self.episodes)} episodes over {self.episodes['storage'].nunique()} storages).")
        large_remat = int(self.remat_large[-1]) if len(self.remat_large) else 0
        text += (f" The large run rematerialized {len(self.held_remats)} storages the small run held "
                 f"(compute {self.held_remat_compute} of its {large_remat} remat compute).")
        if self.failure_step is not None:
            who = "Both runs fail" if self.failing_run == "both" else f"The {self.failing_run} run fails"
            text += (f" {who} at step {self.failure_step}, "
                     f"{self.failure_step - self.first_violation_step} steps after the first violation.")
        return text


def inclusion(trace: Trace, policy: str | Policy | type[Policy] = "dtr", budget_small: int | None = None,
              budget_large: int | None = None, *, ratio_small: float | None = None,
              ratio_large: float | None = None, semantics: Semantics = REFERENCE,
              **policy_params) -> InclusionResult:
    """Replay ``trace`` under ``policy`` at two budgets in lockstep and report inclusion violations.

    Give the budgets in bytes or as ratios of the baseline peak (``ratio_small=0.165,
    ratio_large=0.17``). Each run gets its own copy of the policy. Once one run fails
    the comparison stops; the other run is finished to report its status. Runs use flat
    memory (simrd's) at ``semantics``' overhead limit.
    """
    semantics.require_default(("memory", "memory_options", "enforce", "device_capacity"),
                              "inclusion compares flat-memory runs (simrd's), so it")
    budget_small = _budget(trace, budget_small, ratio_small, "small")
    budget_large = _budget(trace, budget_large, ratio_large, "large")
    if not budget_small < budget_large:
        raise ValueError(f"budget_small must be below budget_large, got {budget_small} and {budget_large}")
    policy = get_policy(policy, **policy_params)
    remat_limit = baseline(trace).model_compute * (semantics.overhead_limit - 1)
    small = Simulator(trace, copy.deepcopy(policy), budget_small, remat_limit)
    large = Simulator(trace, copy.deepcopy(policy), budget_large, remat_limit)
    # Live views of the simulators' residency flags (no copies).
    resident_small = np.frombuffer(small.material, dtype=np.uint8)
    resident_large = np.frombuffer(large.material, dtype=np.uint8)

    n_steps = len(trace.schedule)
    counts = np.zeros(n_steps, dtype=np.int64)
    remat_small = np.zeros(n_steps, dtype=np.int64)
    remat_large = np.zeros(n_steps, dtype=np.int64)
    episodes: list[tuple[int, int, int]] = []  # storage, first step, last step
    open_since: dict[int, int] = {}
    held_remats: list[tuple[int, int]] = []  # step, storage
    violating = np.zeros(len(resident_small), dtype=bool)
    runs = {"small": (small, small.steps()), "large": (large, large.steps())}
    status = {}

    while not status:
        for name, (sim, steps) in runs.items():
            try:
                step = next(steps)
            except StopIteration:
                status[name] = "pass"
            except (OutOfMemory, Thrash):
                status[name] = sim.failure.kind
        if status:
            break
        # Storages the small run held before this step that the large run has now rematerialized.
        for s in np.flatnonzero(violating & (resident_large == 1)):
            held_remats.append((step, int(s)))
        now = resident_small > resident_large
        for s in np.flatnonzero(now != violating):
            s = int(s)
            if now[s]:
                open_since[s] = step
            else:
                episodes.append((s, open_since.pop(s), step - 1))
        violating = now
        counts[step] = len(open_since)
        remat_small[step] = small.remat_compute
        remat_large[step] = large.remat_compute
    # A failing step is not compared; without failures every step was.
    failures = [sim.failure.step for sim in (small, large) if sim.failure is not None]
    steps_compared = min(failures) if failures else n_steps
    episodes.extend((s, first, steps_compared - 1) for s, first in open_since.items())
    for name, (sim, _) in runs.items():
        if name not in status:
            status[name] = sim.run()

    names, sizes, compute = trace.tensor_names, small.size, small.compute_cost
    episode_frame = pd.DataFrame(
        [(s, names[s], sizes[s], first, last, last - first + 1) for s, first, last in sorted(episodes, key=_by_start)],
        columns=["storage", "name", "size", "first_step", "last_step", "steps"])
    held_frame = pd.DataFrame([(step, s, names[s], compute[s]) for step, s in held_remats],
                              columns=["step", "storage", "name", "compute"])
    return InclusionResult(
        trace=trace.name, policy=policy.label, budget_small=budget_small, budget_large=budget_large,
        status_small=status["small"], status_large=status["large"], failure_small=small.failure,
        failure_large=large.failure, steps_compared=steps_compared, violation_counts=counts[:steps_compared],
        episodes=episode_frame, held_remats=held_frame, remat_small=remat_small[:steps_compared],
        remat_large=remat_large[:steps_compared], remat_limit=remat_limit)


def _by_start(episode: tuple[int, int, int]) -> tuple[int, int]:
    storage, first, _ = episode
    return first, storage


def _budget(trace: Trace, budget: int | None, ratio: float | None, which: str) -> int:
    if (budget is None) == (ratio is None):
        raise ValueError(f"give budget_{which} (bytes) or ratio_{which} (a fraction of the baseline peak, e.g. 0.17), "
                         "not both or neither")
    return budget_for(trace, ratio) if budget is None else int(budget)


#: Columns of :attr:`InclusionCensus.pairs`, one row per trace, policy and pair of neighbouring ratios.
PAIR_COLUMNS = ["trace", "policy", "ratio_small", "ratio_large", "budget_small", "budget_large", "status_small",
                "status_large", "breaks", "violating_steps", "max_violations", "first_violation_step", "hole_onset"]


@dataclass(frozen=True)
class InclusionCensus:
    """Inclusion between every pair of neighbouring ratios, over traces and policies.

    A pair **breaks** when some storage is resident at the smaller budget but not at
    the larger one after some compared step. A pair is a **hole onset** when the
    smaller budget passes and the larger one fails: the lower edge of a hole at the
    grid's resolution (every hole of the census has exactly one).
    """

    ratios: tuple[float, ...]
    pairs: pd.DataFrame

    def prediction(self) -> pd.DataFrame:
        """Does a break predict a hole onset? Per policy and over all (last row, policy ``"all"``).

        ``precision`` = onsets among breaking pairs, ``recall`` = breaking pairs among
        onsets (NaN when undefined); compare precision with ``onset_rate``, the
        precision of predicting an onset everywhere. ``violating_steps_onset`` and
        ``_other`` are the mean number of violating steps of onset and other pairs
        (does the size of a break predict better than its presence?). Only pairs whose
        smaller run passes are counted: a pair whose smaller run fails cannot be a
        hole onset.
        """
        eligible = self.pairs[self.pairs["status_small"] == "pass"]
        rows = [_prediction_row(policy, group) for policy, group in eligible.groupby("policy", sort=False)]
        rows.append(_prediction_row("all", eligible))
        return pd.DataFrame(rows)

    def break_rate(self) -> pd.DataFrame:
        """Share of neighbouring pairs that break, per trace (rows) and policy (columns)."""
        return self.pairs.pivot_table(index="trace", columns="policy", values="breaks", aggfunc="mean")


def _prediction_row(policy: str, pairs: pd.DataFrame) -> dict:
    breaks, onsets = pairs["breaks"].astype(bool), pairs["hole_onset"].astype(bool)
    hits = int((breaks & onsets).sum())
    steps = pairs["violating_steps"]
    return {"policy": policy, "pairs": len(pairs), "breaks": int(breaks.sum()), "hole_onsets": int(onsets.sum()),
            "breaks_before_onset": hits,
            "precision": hits / breaks.sum() if breaks.any() else float("nan"),
            "recall": hits / onsets.sum() if onsets.any() else float("nan"),
            "onset_rate": onsets.mean() if len(pairs) else float("nan"),
            "violating_steps_onset": steps[onsets].mean() if onsets.any() else float("nan"),
            "violating_steps_other": steps[~onsets].mean() if (~onsets).any() else float("nan")}


def inclusion_census(traces, policies=("dtr", "msps"), *, ratios="0.05:1.0:0.02", semantics: Semantics = REFERENCE,
                     execution: Execution = SERIAL) -> InclusionCensus:
    """Check :func:`inclusion` between every pair of neighbouring ``ratios``, for every trace and policy.

    ``traces`` is a Trace, a list or a dict of them; ``policies`` names, classes or
    instances; ``ratios`` a list, a ``"start:stop:step"`` range, or a dict trace name ->
    either (e.g. a fine grid only where a trace's holes are); ``semantics`` as in
    :func:`inclusion`. Each (trace, policy) runs in one task (``execution.jobs`` local
    processes; a progress bar with ``execution.progress``; nothing is cached).
    """
    from joblib import Parallel, delayed
    from ..progress import progress_bar

    from ..sweep import parse_ratios

    if isinstance(traces, Trace):
        traces = [traces]
    elif isinstance(traces, dict):
        traces = list(traces.values())
    policies = [get_policy(p) for p in ([policies] if isinstance(policies, (str, Policy)) else policies)]
    per_trace = {t.name: sorted(set(parse_ratios(ratios[t.name] if isinstance(ratios, dict) else ratios)))
                 for t in traces}
    if any(len(r) < 2 for r in per_trace.values()):
        raise ValueError("an inclusion census needs at least two ratios per trace, e.g. '0.05:1.0:0.02'")
    tasks = [(trace, policy) for trace in traces for policy in policies]
    results = Parallel(n_jobs=execution.jobs, return_as="generator")(
        delayed(_pairs_of)(trace, policy, per_trace[trace.name], semantics) for trace, policy in tasks)
    rows = [row for rows in progress_bar(results, total=len(tasks), desc="inclusion census", unit="config",
                                 disable=not execution.progress) for row in rows]
    all_ratios = tuple(sorted({r for ratio_list in per_trace.values() for r in ratio_list}))
    return InclusionCensus(ratios=all_ratios, pairs=pd.DataFrame(rows, columns=PAIR_COLUMNS))


def _pairs_of(trace: Trace, policy: Policy, ratios: list[float], semantics: Semantics) -> list[dict]:
    rows = []
    for small, large in zip(ratios, ratios[1:]):
        if budget_for(trace, small) >= budget_for(trace, large):
            continue
        result = inclusion(trace, policy, ratio_small=small, ratio_large=large, semantics=semantics)
        rows.append({
            "trace": trace.name, "policy": policy.label, "ratio_small": small, "ratio_large": large,
            "budget_small": result.budget_small, "budget_large": result.budget_large,
            "status_small": result.status_small, "status_large": result.status_large, "breaks": not result.holds,
            "violating_steps": len(result.violating_steps),
            "max_violations": int(result.violation_counts.max()) if len(result.violation_counts) else 0,
            "first_violation_step": result.first_violation_step, "hole_onset": result.anomaly})
    return rows
