"""Feasibility holes: budgets where a policy fails although smaller budgets pass.

Definitions, over the sampled budgets of one trace and policy sorted by budget:

* a sample is a **non-monotone failure** when it fails (oom or thrash) while some
  smaller sampled budget passes;
* a **hole** is a maximal run of consecutive failing samples with a passing sample
  on both sides;
* the **feasibility threshold** is the smallest sampled budget from which every
  sample (it included) passes.

:func:`find_holes` measures these on a sweep frame. :func:`refine_holes` adds
samples: it bisects every pass<->fail transition in bytes down to a resolution,
and probes the gaps around *suspicious* passing samples to find holes narrower
than the sampling step (see its docstring and docs/sweeps.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pandas as pd

from ..policies import Policy, get_policy
from ..runtime import FLAT, Intervention, baseline, memory_label, memory_spec
from ..sweep import sweep
from ..sweep.budget_sweep import resolve_trace
from ..trace.model import Trace

MIB = 1 << 20

#: Columns that identify one swept configuration; a census is per configuration.
CONFIGURATION = ["trace", "policy", "overhead_limit", "withhold", "memory", "memory_options"]

#: Columns of :attr:`HoleCensus.holes`, one row per hole.
HOLE_COLUMNS = [
    "pass_below_bytes", "fail_low_bytes", "fail_high_bytes", "pass_above_bytes",
    "pass_below_ratio", "fail_low_ratio", "fail_high_ratio", "pass_above_ratio",
    "width_bytes", "min_width_bytes", "width_ratio", "samples", "kinds",
]


@dataclass(frozen=True)
class HoleCensus:
    """The holes of one trace under one policy.

    ``samples`` is the sweep frame sorted by budget (one row per budget);
    ``holes`` has :data:`HOLE_COLUMNS`. A hole's true extent lies between
    ``[fail_low, fail_high]`` (its failing samples) and ``(pass_below, pass_above)``
    (the passing samples around it): ``min_width_bytes`` and ``width_bytes``.
    """

    trace: str
    policy: str
    samples: pd.DataFrame
    holes: pd.DataFrame
    failures: int
    non_monotone_failures: int
    threshold_bytes: int | None
    threshold_ratio: float | None

    @property
    def widest(self) -> pd.Series | None:
        """The hole with the largest ``width_bytes``, or None."""
        return None if self.holes.empty else self.holes.loc[self.holes["width_bytes"].idxmax()]

    def summary(self) -> dict:
        """One census-table row."""
        widest = self.widest
        return {
            "trace": self.trace, "policy": self.policy, "memory": frame_memory_label(self.samples),
            "samples": len(self.samples), "failures": self.failures,
            "non_monotone_failures": self.non_monotone_failures, "holes": len(self.holes),
            "widest_hole_ratio": (None if widest is None else
                                  f"{widest.fail_low_ratio:.6g}-{widest.fail_high_ratio:.6g}"),
            "widest_hole_mib": None if widest is None else widest.width_bytes / MIB,
            "widest_hole_kinds": None if widest is None else widest.kinds,
            "threshold_ratio": self.threshold_ratio,
        }


def find_holes(frame: pd.DataFrame) -> HoleCensus:
    """Holes, non-monotone failures and the feasibility threshold of one sweep frame."""
    for column in ("trace", "policy", "budget_bytes", "ratio", "status"):
        if column not in frame:
            raise ValueError(f"find_holes needs a sweep frame (dtrlab.sweep(...)); column {column!r} is missing")
    frame = with_memory_columns(frame)
    groups = frame[CONFIGURATION].drop_duplicates()
    if len(groups) != 1:
        raise ValueError(f"the frame mixes {len(groups)} trace/policy configurations; pass one at a time, "
                         "e.g. frame[(frame.trace == T) & (frame.policy == P)], or use census_table(frame)")
    samples = frame.drop_duplicates("budget_bytes").sort_values("budget_bytes", kind="stable")
    samples = samples.reset_index(drop=True)
    passed = (samples["status"] == "pass").to_numpy()
    budgets = samples["budget_bytes"].to_numpy()
    ratios = samples["ratio"].to_numpy()
    statuses = samples["status"].to_numpy()

    seen_pass = passed.cumsum() > 0
    non_monotone = int((~passed & seen_pass).sum())

    holes = []
    i, n = 0, len(samples)
    while i < n:
        if passed[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and not passed[j + 1]:
            j += 1
        if i > 0 and j + 1 < n:  # passing samples on both sides
            below, above = i - 1, j + 1
            holes.append({
                "pass_below_bytes": int(budgets[below]), "fail_low_bytes": int(budgets[i]),
                "fail_high_bytes": int(budgets[j]), "pass_above_bytes": int(budgets[above]),
                "pass_below_ratio": ratios[below], "fail_low_ratio": ratios[i], "fail_high_ratio": ratios[j],
                "pass_above_ratio": ratios[above],
                "width_bytes": int(budgets[above] - budgets[below]), "min_width_bytes": int(budgets[j] - budgets[i]),
                "width_ratio": ratios[above] - ratios[below], "samples": j - i + 1,
                "kinds": "+".join(sorted(set(statuses[i:j + 1]))),
            })
        i = j + 1

    # The threshold is the first sample of the trailing run of passes.
    threshold = None
    if n and passed[-1]:
        threshold = n - 1
        while threshold > 0 and passed[threshold - 1]:
            threshold -= 1
    return HoleCensus(
        trace=str(samples["trace"].iloc[0]), policy=str(samples["policy"].iloc[0]), samples=samples,
        holes=pd.DataFrame(holes, columns=HOLE_COLUMNS), failures=int((~passed).sum()),
        non_monotone_failures=non_monotone,
        threshold_bytes=None if threshold is None else int(budgets[threshold]),
        threshold_ratio=None if threshold is None else float(ratios[threshold]),
    )


def census_table(frame: pd.DataFrame) -> pd.DataFrame:
    """:meth:`HoleCensus.summary` of every trace/policy configuration in a frame."""
    return pd.DataFrame([find_holes(group).summary() for _, group in with_memory_columns(frame).groupby(CONFIGURATION, sort=False)])


@dataclass(frozen=True)
class Refinement:
    """What :func:`refine_holes` sampled and found.

    ``grid`` is the census of the input frame, ``refined`` that of every sample
    (grid, probes and bisection points). ``suspicious`` lists the probed passing
    samples with the reason they were probed.
    """

    grid: HoleCensus
    refined: HoleCensus
    suspicious: pd.DataFrame
    probe_budgets: tuple[int, ...]
    bisection_budgets: tuple[int, ...]
    resolution: int

    @property
    def hidden_holes(self) -> pd.DataFrame:
        """Refined holes that contain no grid sample: narrower than the sampling step."""
        grid = self.grid.samples["budget_bytes"].to_numpy()
        holes = self.refined.holes
        hidden = pd.Series([not ((grid >= low) & (grid <= high)).any()
                            for low, high in zip(holes["fail_low_bytes"], holes["fail_high_bytes"])],
                           index=holes.index, dtype=bool)
        return holes[hidden].reset_index(drop=True)


def default_resolution(trace: Trace) -> int:
    """1 MiB, or 1/10000 of the baseline peak when that is finer (small traces)."""
    return min(MIB, max(1, baseline(trace).peak_memory // 10_000))


def suspicious_samples(samples: pd.DataFrame, spike: float = 0.02, near_miss: float = 0.9) -> pd.DataFrame:
    """Passing samples near which a narrow hole is likely (sorted ``samples`` of one census).

    * ``overhead spike``: the overhead is more than ``spike`` (relative) above that of
      the next smaller passing sample. More memory should never cost more recompute;
      when it does, the eviction sequence has changed course, which is how holes arise.
    * ``near miss``: rematerialization used at least ``near_miss`` of the thrash
      allowance ``baseline compute x (overhead limit - 1)``.
    """
    passing = samples[samples["status"] == "pass"]
    previous = passing["overhead"].shift(1)
    spiked = passing["overhead"] > previous * (1 + spike)
    allowance = passing["baseline_compute"] * (passing["overhead_limit"] - 1)
    near = passing["remat_compute"] >= near_miss * allowance
    reasons = [" + ".join(r for r, flag in (("overhead spike", s), ("near miss", m)) if flag)
               for s, m in zip(spiked, near)]
    flagged = passing.assign(reason=reasons)[spiked | near]
    return flagged[["ratio", "budget_bytes", "overhead", "remat_compute", "reason"]]


def refine_holes(trace: Trace | str | os.PathLike, frame: pd.DataFrame, policy: str | Policy = "dtr", *,
                 resolution: int | None = None, probes: int = 8, spike: float = 0.02, near_miss: float = 0.9,
                 jobs: int = 1, backend: str = "loky", client=None, cache=True, progress: bool = True,
                 **policy_params) -> Refinement:
    """Find hole edges to ``resolution`` bytes and holes narrower than the sampling step.

    1. **Probe**: for each :func:`suspicious_samples` sample, simulate ``probes``
       evenly spaced budgets inside each of the two sampling gaps next to it.
    2. **Bisect**: while two budget-adjacent samples differ in pass/fail and lie more
       than ``resolution`` bytes apart (default :func:`default_resolution`), simulate
       their midpoint (all such gaps in one parallel batch per round). Each gap ends
       with one transition located to ``resolution``; structure finer than that
       inside a gap is not searched.

    ``frame`` is a sweep of ``trace`` under ``policy`` (same overhead limit and
    intervention); all new runs go through :func:`dtrlab.sweep` and its cache.
    """
    trace = resolve_trace(trace)
    if resolution is None:
        resolution = default_resolution(trace)
    if resolution < 1 or probes < 0:
        raise ValueError(f"resolution must be >= 1 byte (default: min(1 MiB, baseline peak / 10000)) and "
                         "probes >= 0; "
                         f"got resolution={resolution}, probes={probes}")
    grid = find_holes(frame)
    memory = _frame_memory(grid.samples.iloc[0], policy_params.pop("memory", None),
                           policy_params.pop("memory_options", None))
    policy = get_policy(policy, **policy_params)
    if policy.label != grid.policy:
        raise ValueError(f"the frame was swept with policy {grid.policy!r}, not {policy.label!r}; "
                         "pass the same policy (and parameters) to refine_holes")
    first = grid.samples.iloc[0]
    withhold = json.loads(first["withhold"]) if first["withhold"] else []
    run = dict(trace=trace, policy=policy, overhead_limit=float(first["overhead_limit"]),
               intervention=Intervention(frozenset(withhold)) if withhold else None, jobs=jobs, backend=backend,
               client=client, cache=cache, progress=progress, **memory)
    samples = grid.samples

    def add(budgets: list[int]) -> None:
        nonlocal samples
        new = sweep(budgets=budgets, **run)
        samples = pd.concat([samples, new], ignore_index=True).drop_duplicates("budget_bytes")
        samples = samples.sort_values("budget_bytes", kind="stable").reset_index(drop=True)

    suspicious = suspicious_samples(grid.samples, spike, near_miss)
    budgets = grid.samples["budget_bytes"].tolist()
    probe_budgets = set()
    for position in suspicious.index:
        for low, high in ((position - 1, position), (position, position + 1)):
            if 0 <= low and high < len(budgets):
                a, b = budgets[low], budgets[high]
                probe_budgets.update(a + (b - a) * j // (probes + 1) for j in range(1, probes + 1))
    probe_budgets -= set(budgets)
    if probe_budgets:
        add(sorted(probe_budgets))

    bisection_budgets = []
    while True:
        budgets = samples["budget_bytes"].to_numpy()
        passed = (samples["status"] == "pass").to_numpy()
        midpoints = [int(budgets[k] + budgets[k + 1]) // 2 for k in range(len(budgets) - 1)
                     if passed[k] != passed[k + 1] and budgets[k + 1] - budgets[k] > resolution]
        if not midpoints:
            break
        bisection_budgets += midpoints
        add(midpoints)
    return Refinement(grid=grid, refined=find_holes(samples), suspicious=suspicious,
                      probe_budgets=tuple(sorted(probe_budgets)), bisection_budgets=tuple(bisection_budgets),
                      resolution=resolution)


@dataclass(frozen=True)
class Census:
    """A census of many traces: the summary table, every refined hole and the files written."""

    table: pd.DataFrame
    holes: pd.DataFrame
    refinements: dict[str, Refinement]
    files: tuple[str, ...]


def with_memory_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the memory columns of a sweep frame (frames saved before them were all flat)."""
    missing = {k: v for k, v in (("memory", FLAT), ("memory_options", "")) if k not in frame}
    return frame.assign(**missing) if missing else frame


def frame_memory_label(frame: pd.DataFrame) -> str:
    """The memory model of a one-configuration sweep frame, e.g. ``caching(expandable_segments=True)``."""
    row = with_memory_columns(frame.iloc[:1]).iloc[0]
    return memory_label(row["memory"], json.loads(row["memory_options"]) if row["memory_options"] else {})


def _frame_memory(row: pd.Series, memory=None, memory_options: dict | None = None) -> dict:
    """The memory model a sweep frame was simulated under (flat for frames without the column);
    a model given as well must be the same."""
    name = row.get("memory") or FLAT
    options = json.loads(row["memory_options"]) if row.get("memory_options") else {}
    if memory is not None and memory_spec(memory, memory_options) != (name, options):
        raise ValueError(f"the frame was swept under the {name!r} memory model with options {options}, not "
                         f"{memory!r} with {memory_options or {}}; refine it under its own model")
    return {"memory": name, "memory_options": options}


def run_census(traces: dict[str, Trace], policy: str | Policy = "dtr", *, ratios="0.05:1.0:0.005",
               out: str | os.PathLike | None = None, refine: bool = True, resolution: int | None = None,
               jobs: int = 1,
               backend: str = "loky", client=None, overhead_limit: float | None = None, cache=True,
               progress: bool = True, **policy_params) -> Census:
    """Sweep every trace, census its holes and (with ``refine``) refine them.

    With ``out``, writes ``OUT/{trace}.parquet`` (the grid sweep, every refinement
    sample appended with ``ratio = budget / peak``), ``OUT/holes.parquet`` and
    ``OUT/summary.csv``. The table has, per trace, the grid census (samples,
    failures, non-monotone failures, holes, widest hole) and, refined, the hole
    count, the hidden holes (narrower than the sampling step) and the widest hole's
    width to ``resolution``.
    """
    from pathlib import Path

    if not traces:
        raise ValueError("no traces to census; pass a directory of logs such as ../shared/dtr-logs or traces/")
    options = dict(jobs=jobs, backend=backend, client=client, cache=cache, progress=progress, **policy_params)
    limit = {} if overhead_limit is None else {"overhead_limit": overhead_limit}
    directory = Path(out) if out is not None else None
    if directory:
        directory.mkdir(parents=True, exist_ok=True)
    rows, holes, refinements, files = [], [], {}, []
    for name, trace in traces.items():
        frame = sweep(trace, policy, ratios=ratios, **limit, **options)
        grid = find_holes(frame)
        row = grid.summary()
        samples, found = frame, grid.holes.assign(hidden=False)
        if refine:
            refinement = refine_holes(trace, frame, policy, resolution=resolution, **options)
            refinements[name] = refinement
            hidden = refinement.hidden_holes
            refined_widest = refinement.refined.widest
            row.update({"refined_holes": len(refinement.refined.holes), "hidden_holes": len(hidden),
                        "refined_widest_mib": None if refined_widest is None else refined_widest.width_bytes / MIB,
                        "refined_threshold_ratio": refinement.refined.threshold_ratio,
                        "refinement_runs": len(refinement.probe_budgets) + len(refinement.bisection_budgets)})
            samples = refinement.refined.samples
            found = refinement.refined.holes.assign(
                hidden=refinement.refined.holes["fail_low_bytes"].isin(hidden["fail_low_bytes"]))
        rows.append(row)
        holes.append(found.assign(trace=name, policy=grid.policy))
        if directory:
            path = directory / f"{name}.parquet"
            samples.to_parquet(path, index=False)
            files.append(str(path))
    table = pd.DataFrame(rows)
    hole_table = pd.concat(holes, ignore_index=True)
    if directory:
        hole_table.to_parquet(directory / "holes.parquet", index=False)
        table.to_csv(directory / "summary.csv", index=False)
        files += [str(directory / "holes.parquet"), str(directory / "summary.csv")]
    return Census(table=table, holes=hole_table, refinements=refinements, files=tuple(files))
