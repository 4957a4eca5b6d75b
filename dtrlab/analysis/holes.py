"""Feasibility holes: budgets where a policy fails although smaller budgets pass.

Definitions, over the sampled budgets of one trace and policy sorted by budget:

* a sample is a **non-monotone failure** when it fails (oom or thrash) while some
  smaller sampled budget passes;
* a **hole** is a maximal run of consecutive failing samples with a passing sample
  on both sides;
* the **feasibility threshold** is the smallest sampled budget from which every
  sample (it included) passes.

:func:`find_holes` measures these on a sweep frame. :func:`refine_holes` adds
samples: with ``delta`` it first samples the frame's whole range so that no two
samples are more than ``delta`` bytes apart (the guarantee: every hole at least
``delta`` wide inside the range holds a sample; docs/sweeps.md states and proves
it); it probes the gaps around *suspicious* passing samples to find holes narrower
than the sampling step, and bisects every pass<->fail transition in bytes down to
a resolution (see its docstring).
"""

from __future__ import annotations

import json
import os
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..policies import Policy, get_policy
from ..runtime import FLAT, REFERENCE, Intervention, Semantics, baseline, budget_for, memory_label, refuse_loose
from ..sweep import SERIAL, Execution, sweep
from ..sweep.budget_sweep import MAX_BUDGETS, parse_ratios, resolve_trace
from ..trace.model import Trace

MIB = 1 << 20

#: Columns that identify one swept configuration; a census is per configuration.
CONFIGURATION = ["trace", "policy", "overhead_limit", "withhold", "memory", "memory_options", "enforce",
                 "device_capacity"]

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
    ``max_gap_bytes`` is the largest distance between budget-adjacent samples: every
    hole of at least that many budgets between the smallest and the largest sample
    holds a sample (docs/sweeps.md, "The guarantee").
    """

    trace: str
    policy: str
    samples: pd.DataFrame
    holes: pd.DataFrame
    failures: int
    non_monotone_failures: int
    threshold_bytes: int | None
    threshold_ratio: float | None
    max_gap_bytes: int = 0

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
            "threshold_ratio": self.threshold_ratio, "max_gap_bytes": self.max_gap_bytes,
        }


def delta_bytes(delta: int | float, peak: int) -> int:
    """A sampling resolution in bytes: an integer ``delta >= 1`` is bytes, a float in
    (0, 1) a fraction of the baseline ``peak``: ``ceil(delta * peak) + 1``, the largest
    gap between the budgets ``int(peak * ratio)`` of a ``START:STOP:delta`` ratio grid
    (the byte absorbs their rounding), so such a grid needs no fill."""
    if isinstance(delta, float) and 0 < delta < 1:
        return math.ceil(delta * peak) + 1
    if float(delta) == int(delta) and int(delta) >= 1:
        return int(delta)
    raise ValueError(f"delta is bytes (an integer >= 1) or a fraction of the baseline peak in (0, 1), "
                     f"e.g. 0.001 for peak/1000; got {delta!r}")


def max_gap(budgets) -> int:
    """The largest distance between budget-adjacent samples (0 for fewer than two)."""
    budgets = np.unique(np.asarray(budgets, dtype=np.int64))
    return int(np.diff(budgets).max()) if len(budgets) > 1 else 0


def find_holes(frame: pd.DataFrame, delta: int | float | None = None) -> HoleCensus:
    """Holes, non-monotone failures and the feasibility threshold of one sweep frame.

    With ``delta`` (bytes, or a fraction of the baseline peak; see :func:`delta_bytes`)
    the frame must sample its range at least that finely, so that the census carries
    the guarantee of docs/sweeps.md for holes of ``delta`` bytes; a coarser frame is an
    error that names its widest gap (:func:`refine_holes` with ``delta`` fills it).
    """
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

    gap = max_gap(budgets)
    if delta is not None:
        if isinstance(delta, float) and delta < 1 and "baseline_memory" not in samples:
            raise ValueError("a fractional delta needs the frame's baseline_memory column (a dtrlab.sweep frame); "
                             "give delta in bytes instead")
        limit = delta_bytes(delta, int(samples["baseline_memory"].iloc[0]) if "baseline_memory" in samples else 1)
        if gap > limit:
            at = int(np.argmax(np.diff(budgets)))
            raise ValueError(f"the samples are {gap:,} bytes apart between budgets {int(budgets[at]):,} and "
                             f"{int(budgets[at + 1]):,}, coarser than delta = {limit:,} bytes; sample more finely "
                             "(refine_holes(trace, frame, delta=...) fills every gap)")

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
        threshold_ratio=None if threshold is None else float(ratios[threshold]), max_gap_bytes=gap,
    )


def configurations(frame: pd.DataFrame):
    """``(key, rows)`` per trace/policy configuration of a sweep frame, every row in one: a frame concatenated
    from sweeps saved before and after the memory columns has them missing in part (pandas' groupby would drop
    those rows), and a missing value is the flat default (:func:`with_memory_columns`)."""
    frame = with_memory_columns(frame)
    frame = frame.fillna({k: v for k, v in MEMORY_DEFAULTS.items() if frame[k].isna().any()})
    return frame.groupby(CONFIGURATION, sort=False, dropna=False)


def census_table(frame: pd.DataFrame) -> pd.DataFrame:
    """:meth:`HoleCensus.summary` of every trace/policy configuration in a frame."""
    return pd.DataFrame([find_holes(group).summary() for _, group in configurations(frame)])


@dataclass(frozen=True)
class Refinement:
    """What :func:`refine_holes` sampled and found.

    ``grid`` is the census of the input frame, ``refined`` that of every sample
    (grid, fill, probes and bisection points). ``suspicious`` lists the probed passing
    samples with the reason they were probed. With ``delta``, ``fill_budgets`` are the
    budgets added so that no two samples are more than ``delta_bytes`` apart, and
    ``refined.max_gap_bytes`` (at most ``delta_bytes``) is the width from which every
    hole inside the sampled range is guaranteed to hold a sample.
    """

    grid: HoleCensus
    refined: HoleCensus
    suspicious: pd.DataFrame
    probe_budgets: tuple[int, ...]
    bisection_budgets: tuple[int, ...]
    resolution: int
    fill_budgets: tuple[int, ...] = ()
    delta_bytes: int | None = None

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


def fill_budgets(budgets, delta: int) -> list[int]:
    """Budgets to add between the smallest and the largest of ``budgets`` so that no two
    budget-adjacent samples are more than ``delta`` bytes apart.

    A gap ``g > delta`` gets ``ceil(g / delta) - 1`` evenly spaced budgets, so its
    pieces are ``floor`` or ``ceil`` of ``g / ceil(g / delta) <= delta``.
    """
    if delta < 1:
        raise ValueError(f"delta must be >= 1 byte, got {delta}")
    budgets = sorted(set(int(b) for b in budgets))
    count = sum(-(-(high - low) // delta) - 1 for low, high in zip(budgets, budgets[1:]))
    if count > MAX_BUDGETS:
        raise ValueError(f"delta = {delta:,} bytes makes {count:,} budgets, more than the {MAX_BUDGETS:,} allowed; "
                         "take a larger delta (a fraction such as 0.001 of the peak, or more bytes)")
    added = []
    for low, high in zip(budgets, budgets[1:]):
        gap = high - low
        pieces = -(-gap // delta)  # ceil
        added += [low + gap * j // pieces for j in range(1, pieces)]
    return added


def gap_probes(budgets: list[int], positions, probes: int) -> set[int]:
    """``probes`` evenly spaced budgets in each gap beside the samples at ``positions`` of the
    sorted ``budgets`` (the probing step of :func:`refine_holes`), without budgets already run."""
    found = set()
    for position in positions:
        for low, high in ((position - 1, position), (position, position + 1)):
            if 0 <= low and high < len(budgets):
                a, b = budgets[low], budgets[high]
                found.update(a + (b - a) * j // (probes + 1) for j in range(1, probes + 1))
    return found - set(budgets)


def bisect_transitions(passed: dict[int, bool], run: Callable[[list[int]], dict[int, bool]],
                       resolution: int) -> list[int]:
    """Bisect every pass<->fail transition of ``passed`` (budget -> passed) in bytes.

    While two budget-adjacent samples differ and lie more than ``resolution`` bytes
    apart, their midpoint is sampled; ``run(budgets)`` samples a whole round at once
    and returns budget -> passed. ``passed`` is updated in place; returns the
    bisection budgets in the order they were sampled. Each gap ends with one
    transition located to ``resolution``; structure finer than that inside a gap is
    not searched (the midpoints never land between two samples that agree).
    """
    sampled = []
    while True:
        budgets = sorted(passed)
        midpoints = [(low + high) // 2 for low, high in zip(budgets, budgets[1:])
                     if passed[low] != passed[high] and high - low > resolution]
        if not midpoints:
            return sampled
        sampled += midpoints
        passed.update(run(midpoints))


def refine_holes(trace: Trace | str | os.PathLike, frame: pd.DataFrame, policy: str | Policy = "dtr", *,
                 delta: int | float | None = None, resolution: int | None = None, probes: int | None = None,
                 spike: float = 0.02, near_miss: float = 0.9, execution: Execution = SERIAL,
                 **policy_params) -> Refinement:
    """Find hole edges to ``resolution`` bytes and holes narrower than the sampling step.

    1. **Fill** (with ``delta``, bytes or a fraction of the baseline peak, see
       :func:`delta_bytes`): sample the range of ``frame``'s budgets so that no two
       budget-adjacent samples are more than ``delta`` bytes apart (:func:`fill_budgets`).
       Then every hole at least ``delta`` wide inside the range holds a sample
       (docs/sweeps.md, "The guarantee").
    2. **Probe**: for each :func:`suspicious_samples` sample, simulate ``probes``
       evenly spaced budgets inside each of the two sampling gaps next to it
       (default 8 without ``delta``, 0 with it: the fill already samples every gap).
    3. **Bisect**: while two budget-adjacent samples differ in pass/fail and lie more
       than ``resolution`` bytes apart (default :func:`default_resolution`), simulate
       their midpoint (all such gaps in one parallel batch per round); see
       :func:`bisect_transitions`.

    ``frame`` is a sweep of ``trace`` under ``policy``; all new runs go through
    :func:`dtrlab.sweep` (with ``execution``) and its cache, under the frame's own semantics
    (:meth:`~dtrlab.runtime.semantics.Semantics.from_row`) and intervention.
    """
    loose = sorted(set(policy_params) & set(Semantics.__dataclass_fields__))
    if loose:
        raise TypeError(f"{', '.join(loose)}: refine_holes runs under the frame's own semantics (its rows' memory, "
                        "enforce, device capacity and overhead limit); sweep again to refine under another")
    refuse_loose(policy_params, Execution, "execution")
    trace = resolve_trace(trace)
    if resolution is None:
        resolution = default_resolution(trace)
    if probes is None:
        probes = 8 if delta is None else 0
    if resolution < 1 or probes < 0:
        raise ValueError(f"resolution must be >= 1 byte (default: min(1 MiB, baseline peak / 10000)) and "
                         "probes >= 0; "
                         f"got resolution={resolution}, probes={probes}")
    delta = None if delta is None else delta_bytes(delta, baseline(trace).peak_memory)
    grid = find_holes(frame)
    policy = get_policy(policy, **policy_params)
    if policy.label != grid.policy:
        raise ValueError(f"the frame was swept with policy {grid.policy!r}, not {policy.label!r}; "
                         "pass the same policy (and parameters) to refine_holes")
    first = grid.samples.iloc[0]
    withhold = json.loads(first["withhold"]) if first["withhold"] else []
    run = dict(trace=trace, policy=policy, semantics=Semantics.from_row(first),
               intervention=Intervention(frozenset(withhold)) if withhold else None, execution=execution)
    new_frames = []

    def simulate_budgets(budgets: list[int]) -> dict[int, bool]:
        new = sweep(budgets=budgets, **run)
        new_frames.append(new)
        return dict(zip(new["budget_bytes"].tolist(), (new["status"] == "pass").tolist()))

    passed = dict(zip(grid.samples["budget_bytes"].tolist(), (grid.samples["status"] == "pass").tolist()))
    filled = []
    if delta is not None:
        filled = fill_budgets(passed, delta)
        if filled:
            passed.update(simulate_budgets(filled))

    # Suspicious samples come from the grid (with delta: grid and fill) before any probing.
    samples = pd.concat([grid.samples, *new_frames], ignore_index=True).drop_duplicates("budget_bytes")
    samples = samples.sort_values("budget_bytes", kind="stable").reset_index(drop=True)
    suspicious = suspicious_samples(samples, spike, near_miss)
    probe_budgets = gap_probes(samples["budget_bytes"].tolist(), suspicious.index, probes)
    if probe_budgets:
        passed.update(simulate_budgets(sorted(probe_budgets)))

    bisection_budgets = bisect_transitions(passed, simulate_budgets, resolution)
    samples = pd.concat([grid.samples, *new_frames], ignore_index=True).drop_duplicates("budget_bytes")
    return Refinement(grid=grid, refined=find_holes(samples), suspicious=suspicious,
                      probe_budgets=tuple(sorted(probe_budgets)), bisection_budgets=tuple(bisection_budgets),
                      resolution=resolution, fill_budgets=tuple(filled), delta_bytes=delta)


@dataclass(frozen=True)
class Census:
    """A census of many traces: the summary table, every refined hole and the files written."""

    table: pd.DataFrame
    holes: pd.DataFrame
    refinements: dict[str, Refinement]
    files: tuple[str, ...]


def census_grid(trace: Trace, ratios, delta: int | float | None) -> dict:
    """The grid sweep's ``ratios=`` or ``budgets=`` keyword: ``ratios`` as given, or with
    ``delta`` the range ``START:STOP`` of ``ratios`` every ``delta``: for a fraction the
    ratios ``START:STOP:delta`` (the budgets of a plain sweep at that step, so the
    census shares its cached results), for bytes every ``delta`` bytes."""
    if delta is None:
        return {"ratios": ratios}
    if isinstance(ratios, str):
        try:
            start, stop = (float(x) for x in ratios.split(":")[:2])
        except ValueError:
            raise ValueError(f"ratios must look like START:STOP:STEP, e.g. 0.05:1.0:0.005; got {ratios!r}") from None
    else:
        values = parse_ratios(ratios)
        start, stop = min(values), max(values)
    if isinstance(delta, float) and 0 < delta < 1:
        return {"ratios": f"{start!r}:{stop!r}:{delta!r}"}
    low, high = budget_for(trace, start), budget_for(trace, stop)
    return {"budgets": sorted({low, high, *fill_budgets([low, high], delta_bytes(delta, 1))})}


#: The memory columns of a sweep frame and their values in frames saved before them (all flat).
MEMORY_DEFAULTS = {"memory": FLAT, "memory_options": "", "enforce": "reserved", "device_capacity": ""}


def with_memory_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the memory columns of a sweep frame (frames saved before them were all flat)."""
    missing = {k: v for k, v in MEMORY_DEFAULTS.items() if k not in frame}
    return frame.assign(**missing) if missing else frame


def frame_memory_label(frame: pd.DataFrame) -> str:
    """The memory model of a one-configuration sweep frame, e.g. ``caching(expandable_segments=True)``."""
    row = with_memory_columns(frame.iloc[:1]).iloc[0]
    return memory_label(row["memory"], json.loads(row["memory_options"]) if row["memory_options"] else {})


def run_census(traces: dict[str, Trace], policy: str | Policy = "dtr", *, ratios="0.05:1.0:0.005",
               delta: int | float | None = None, out: str | os.PathLike | None = None, refine: bool = True,
               resolution: int | None = None, probes: int | None = None, semantics: Semantics = REFERENCE,
               execution: Execution = SERIAL) -> Census:
    """Sweep every trace under ``policy`` (a name, or an instance with its parameters) and
    ``semantics``, census its holes and (with ``refine``) refine them; runs go where ``execution`` says.

    With ``delta`` (a fraction of each trace's baseline peak such as ``0.001``, or
    bytes), the census samples the range ``START:STOP`` of ``ratios`` every ``delta``
    (:func:`census_grid`, then :func:`refine_holes` fills any gap the rounding of
    budgets left wider) and bisects every edge: every hole at least ``delta`` wide
    inside the range is found (docs/sweeps.md, "The guarantee"). Without it, the grid
    is ``ratios`` and refinement probes suspicious samples (``probes``, default 8).

    With ``out``, writes ``OUT/{trace}.parquet`` (the grid sweep, every refinement
    sample appended with ``ratio = budget / peak``), ``OUT/holes.parquet`` and
    ``OUT/summary.csv``. The table has, per trace, the grid census (samples,
    failures, non-monotone failures, holes, widest hole) and, refined, the hole
    count, the hidden holes (narrower than the sampling step), the widest hole's
    width to ``resolution`` and the largest gap between samples (``refined_max_gap_bytes``,
    the width from which every hole is guaranteed to be found).
    """
    from pathlib import Path

    if not traces:
        raise ValueError("no traces to census; pass a directory of logs such as ../shared/dtr-logs or traces/")
    directory = Path(out) if out is not None else None
    if directory:
        directory.mkdir(parents=True, exist_ok=True)
    rows, holes, refinements, files = [], [], {}, []
    for name, trace in traces.items():
        frame = sweep(trace, policy, **census_grid(trace, ratios, delta), semantics=semantics, execution=execution)
        grid = find_holes(frame)
        row = grid.summary()
        samples, found = frame, grid.holes.assign(hidden=False)
        if refine:
            refinement = refine_holes(trace, frame, policy, delta=delta, resolution=resolution, probes=probes,
                                      execution=execution)
            refinements[name] = refinement
            hidden = refinement.hidden_holes
            refined_widest = refinement.refined.widest
            row.update({"refined_holes": len(refinement.refined.holes), "hidden_holes": len(hidden),
                        "refined_widest_mib": None if refined_widest is None else refined_widest.width_bytes / MIB,
                        "refined_threshold_ratio": refinement.refined.threshold_ratio,
                        "refined_max_gap_bytes": refinement.refined.max_gap_bytes,
                        "refinement_runs": (len(refinement.fill_budgets) + len(refinement.probe_budgets)
                                            + len(refinement.bisection_budgets))})
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
