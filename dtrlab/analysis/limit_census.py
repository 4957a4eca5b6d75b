"""The overhead limit as a census axis: holes, thresholds and hole anatomy at every limit.

:func:`limit_census` sweeps each trace once per (policy, memory model) at the largest
limit asked for (``math.inf``: no limit) and derives the census at every smaller limit
from those runs with :func:`~dtrlab.analysis.anatomy.outcome_at` (exact for the
policies that do not read the limit: docs/sweeps.md, "Hole anatomy"). Refinement works
as :func:`~dtrlab.analysis.holes.refine_holes` does, per limit, on the derived outcomes:
probes around suspicious passing samples, then bisection of every pass/fail edge, every
new budget simulated once at the sweep's limit (and cached) and derived at each limit.
A policy that reads the limit (:data:`~dtrlab.analysis.anatomy.LIMIT_READERS`,
``monotone``) is swept and refined at each limit directly, and gets no anatomy.

Under the DTR prototype's ``enforce="allocated"`` semantics an OOM run's recompute may
never have been checked against the limit, so no outcome is derived: every policy is
swept and refined at each limit directly; the limit-blind ones still get their anatomy
(a direct run that passed or ran out of memory is the run without a limit up to its end,
since the two runs are the same until the first thrash check that fails). Its rows carry
the memory label ``MODEL/allocated`` (``MODEL/allocated(DEVICE)`` for a device other than
the sweep's default, unlimited).

The anatomy of each hole (:func:`~dtrlab.analysis.anatomy.hole_anatomy`) needs the
failing samples' runs without a limit: a run at the sweep's limit that passed or ran out
of memory is that run (it never reached the limit); one that thrashed is simulated
again without a limit (through :func:`~dtrlab.sweep.sweep` and its cache).

The shipped tables (``results/shipped/anatomy/``, written by ``dtrlab ship anatomy``)
are read back by :func:`read_anatomy_table`, which checks them against the bundle's
``MANIFEST.json`` first.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..integrity import IntegrityError, verify_in_manifest
from ..memory.device import device_capacity as parse_device_capacity
from ..policies import get_policy
from ..runtime import ALLOCATED, REFERENCE, RESERVED, Semantics
from ..sweep import SERIAL, Execution, sweep
from ..sweep.budget_sweep import resolve_trace
from ..sweep.shipped import DEFAULT_SHIPPED_DIR
from ..trace.model import Trace
from .anatomy import LIMIT_READERS, hole_anatomy, outcomes_at
from .holes import (MIB, bisect_transitions, default_resolution, find_holes, gap_probes, refine_holes,
                    suspicious_samples)

#: The limits of the census axis: a fifth to four times the default's allowance, and no limit.
DEFAULT_LIMITS = (1.25, 1.5, 2.0, 3.0, 5.0, math.inf)
#: The hole kinds of :func:`~dtrlab.analysis.anatomy.hole_anatomy` and their count's column in the table.
KINDS = {"oom": "oom_holes", "cliff": "cliff_holes", "near-miss": "near_miss_holes", "limit": "limit_holes"}
#: Columns of :attr:`LimitCensus.table`, one row per (trace, policy, memory, limit).
TABLE_COLUMNS = ["trace", "policy", "memory", "limit", "sweep_limit", "samples", "failures",
                 "non_monotone_failures", "holes", "threshold_ratio", *KINDS.values(), "widest_hole_mib"]
#: Columns of :attr:`LimitCensus.samples`, one row per (trace, policy, memory, limit, budget).
SAMPLE_COLUMNS = ["trace", "policy", "memory", "limit", "ratio", "budget_bytes", "status", "sweep_status",
                  "overhead", "remat_compute", "baseline_compute", "needed_limit"]
#: Where the shipped census lies (``dtrlab ship anatomy`` writes it).
SHIPPED_ANATOMY = DEFAULT_SHIPPED_DIR / "anatomy"


@dataclass(frozen=True)
class LimitCensus:
    """:func:`limit_census`'s result: ``table`` (:data:`TABLE_COLUMNS`), ``holes`` (every hole
    at every limit: the hole columns, ``trace``, ``policy``, ``memory``, ``limit`` and, for
    limit-blind policies, :data:`~dtrlab.analysis.anatomy.ANATOMY_COLUMNS`) and ``samples``
    (:data:`SAMPLE_COLUMNS`: every sampled budget's outcome at every limit)."""

    table: pd.DataFrame
    holes: pd.DataFrame
    samples: pd.DataFrame


def limit_census(traces: dict[str, Trace], policies=("dtr",), memories=("flat",), limits=DEFAULT_LIMITS, *,
                 ratios="0.05:1.0:0.005", refine: bool = True, probes: int = 8, resolution: int | None = None,
                 semantics: Semantics = REFERENCE, execution: Execution = SERIAL) -> LimitCensus:
    """The census of every trace under every policy and memory model at every limit of ``limits``.

    Each (trace, policy, memory) is swept once on ``ratios`` at ``max(limits)`` and every
    limit's census derived from it (monotone: swept at each limit); with ``refine``, each
    limit's census is refined (``probes`` budgets in the gaps beside each suspicious
    sample, then bisection to ``resolution`` bytes, default
    :func:`~dtrlab.analysis.holes.default_resolution`). ``semantics`` gives the runtime semantics
    (``enforce``, ``device_capacity``), as in :func:`~dtrlab.sweep.sweep`
    (``"allocated"``: every limit swept directly, rows labelled ``MODEL/allocated`` or
    ``MODEL/allocated(DEVICE)``); its memory model and limit are the axes ``memories`` and
    ``limits``. ``execution`` is every sweep's. See the module docstring.
    """
    semantics.require_default(("memory", "memory_options", "overhead_limit"),
                              "the census's memories= (model names) and limits= set")
    enforce = semantics.enforce
    limits = sorted({float(limit) for limit in limits})
    if not limits or limits[0] < 1:
        raise ValueError(f"limits must be overhead limits >= 1 (math.inf: no limit), e.g. {DEFAULT_LIMITS}; "
                         f"got {limits}")
    if not traces:
        raise ValueError("no traces to census; pass a directory of logs such as ../shared/dtr-logs or traces/")
    if enforce not in (RESERVED, ALLOCATED):
        raise ValueError(f"enforce must be {RESERVED!r} or {ALLOCATED!r}, got {enforce!r}")
    tables, holes, samples = [], [], []
    for name, trace in traces.items():
        trace = resolve_trace(trace)
        for policy in policies:
            for memory in memories:
                blind = get_policy(policy).name not in LIMIT_READERS
                direct = not blind or enforce == ALLOCATED
                run = dict(trace=trace, policy=policy, semantics=semantics.with_(memory=memory), execution=execution)
                censuses = _direct_censuses(run, limits, ratios, refine, probes, resolution, blind) if direct else \
                    _derived_censuses(run, limits, ratios, refine, probes, resolution)
                label = _memory_label(memory, enforce, semantics.device_capacity)
                for limit, (census, anatomy) in censuses.items():
                    config = {"trace": name, "policy": census.policy, "memory": label, "limit": limit}
                    tables.append({**config, **_summary(census, anatomy, limit if direct else limits[-1])})
                    holes.append((anatomy if anatomy is not None else census.holes).assign(**config))
                    samples.append(_samples(census.samples).assign(**config))
    return LimitCensus(table=pd.DataFrame(tables, columns=TABLE_COLUMNS),
                       holes=pd.concat(holes, ignore_index=True),
                       samples=pd.concat(samples, ignore_index=True)[SAMPLE_COLUMNS])


def _memory_label(memory: str, enforce: str, device) -> str:
    """``MODEL``, ``MODEL/allocated`` (an unlimited device, the sweep's default) or ``MODEL/allocated(DEVICE)``."""
    if enforce == RESERVED:
        return memory
    device = parse_device_capacity(device)
    return f"{memory}/{ALLOCATED}" if device == parse_device_capacity(None) else f"{memory}/{ALLOCATED}({device.label})"


def _at_limit(run: dict, limit: float) -> dict:
    """The sweep keywords ``run`` (trace, policy, semantics, execution) at overhead limit ``limit``."""
    return {**run, "semantics": run["semantics"].with_(overhead_limit=limit)}


def _derived_censuses(run, limits, ratios, refine, probes, resolution) -> dict:
    """Every limit's (census, anatomy) from runs at the largest limit only (``run``: the sweep's keywords)."""
    top = _at_limit(run, limits[-1])
    trace = run["trace"]
    frames = [sweep(ratios=ratios, **top)]

    def runs() -> pd.DataFrame:
        """Every run so far at the sweep's limit, one per budget, by budget."""
        frame = pd.concat(frames, ignore_index=True).drop_duplicates("budget_bytes")
        return frame.sort_values("budget_bytes", kind="stable").reset_index(drop=True)

    def simulate_at(limit: float, budgets: list[int]) -> pd.DataFrame:
        frames.append(sweep(budgets=sorted(set(budgets)), **top))
        return outcomes_at(frames[-1], [limit])

    result = {}
    for limit in limits:
        if refine:
            _refine_derived(lambda: outcomes_at(runs(), [limit]), lambda b: simulate_at(limit, b), probes,
                            resolution if resolution is not None else default_resolution(trace))
        own = runs()
        census = find_holes(outcomes_at(own, [limit]).assign(sweep_status=own["status"]))
        result[limit] = (census, hole_anatomy(census, _unlimited(census, own, run)))
    return result


def _refine_derived(frame_at, simulate_at, probes: int, resolution: int) -> None:
    """:func:`~dtrlab.analysis.holes.refine_holes`' probing and bisection on derived outcomes:
    ``frame_at()`` is every run so far at this limit, ``simulate_at(budgets)`` runs new
    budgets (at the sweep's limit) and returns them at this limit."""
    samples = frame_at()
    probe_budgets = gap_probes(samples["budget_bytes"].tolist(), suspicious_samples(samples).index, probes)
    if probe_budgets:
        simulate_at(sorted(probe_budgets))
    samples = frame_at()
    passed = dict(zip(samples["budget_bytes"].tolist(), (samples["status"] == "pass").tolist()))

    def run(new: list[int]) -> dict[int, bool]:
        frame = simulate_at(new)
        return dict(zip(frame["budget_bytes"].tolist(), (frame["status"] == "pass").tolist()))

    bisect_transitions(passed, run, resolution)


def _unlimited(census, own: pd.DataFrame, run: dict) -> pd.DataFrame:
    """Runs without a limit at the census's failing hole samples: the sweep's own run (``own``)
    where it never reached its limit (passed or ran out of memory: the run without a limit is
    the same run), a new run where it thrashed."""
    budgets = own["budget_bytes"]
    inside = pd.Series(False, index=own.index)
    for low, high in zip(census.holes["fail_low_bytes"], census.holes["fail_high_bytes"]):
        inside |= (budgets >= low) & (budgets <= high)
    failing = own[inside]
    thrashed = failing["status"] == "thrash"
    again = [sweep(budgets=failing.loc[thrashed, "budget_bytes"].tolist(), **_at_limit(run, math.inf))] \
        if thrashed.any() else []
    frame = pd.concat([failing[~thrashed], *again], ignore_index=True)
    return frame[["budget_bytes", "status", "remat_compute"]].assign(overhead_limit=math.inf)


def _direct_censuses(run, limits, ratios, refine, probes, resolution, anatomy: bool) -> dict:
    """Every limit's (census, anatomy) from sweeps at that limit: for policies that read the limit (no
    anatomy) and for every policy under ``enforce="allocated"`` (with ``anatomy``: see the module docstring)."""
    result = {}
    for limit in limits:
        frame = sweep(ratios=ratios, **_at_limit(run, limit))
        census = find_holes(frame)
        if refine:
            census = refine_holes(run["trace"], frame, run["policy"], probes=probes, resolution=resolution,
                                  execution=run["execution"]).refined
        result[limit] = (census, hole_anatomy(census, _unlimited(census, census.samples, run)) if anatomy else None)
    return result


def _summary(census, anatomy: pd.DataFrame | None, sweep_limit: float) -> dict:
    counts = ({column: int((anatomy["anatomy"] == kind).sum()) for kind, column in KINDS.items()}
              if anatomy is not None else dict.fromkeys(KINDS.values()))
    widest = census.widest
    return {"sweep_limit": sweep_limit, "samples": len(census.samples), "failures": census.failures,
            "non_monotone_failures": census.non_monotone_failures, "holes": len(census.holes),
            "threshold_ratio": census.threshold_ratio, **counts,
            "widest_hole_mib": None if widest is None else widest.width_bytes / MIB}


def _samples(frame: pd.DataFrame) -> pd.DataFrame:
    """A census's samples in :data:`SAMPLE_COLUMNS`; a direct sweep (monotone) ran at the limit itself."""
    if "needed_limit" not in frame:
        frame = frame.assign(sweep_status=frame["status"], needed_limit=None)
    return frame[[c for c in SAMPLE_COLUMNS if c not in ("trace", "policy", "memory", "limit")]]


def grid_steps(frame: pd.DataFrame) -> pd.Series:
    """The step of each shipped row's census grid (the last field of its ``ratios``, e.g. ``"0.005"``);
    empty strings for a frame without the column (a census computed here)."""
    if "ratios" not in frame:
        return pd.Series("", index=frame.index)
    return frame["ratios"].astype(str).str.rsplit(":", n=1).str[-1]


def read_anatomy_table(name: str, directory: str | os.PathLike | None = None) -> pd.DataFrame:
    """A shipped table of the limit census (e.g. ``dtr-logs-table.csv``, ``-holes.csv``,
    ``-samples.csv.gz``), checked against its bundle's ``MANIFEST.json`` first (the shipped
    bundle's for a file inside it, else ``directory``'s own). An unlisted, edited or truncated file
    raises :class:`~dtrlab.integrity.IntegrityError` (one line: the file, why, how to mend it)."""
    path = Path(directory or SHIPPED_ANATOMY) / name
    if not path.is_file():
        raise FileNotFoundError(f"no shipped anatomy table {path} (dtrlab ship anatomy writes it)")
    bundle = DEFAULT_SHIPPED_DIR.resolve()
    root = bundle if path.resolve().is_relative_to(bundle) else path.parent
    try:
        verify_in_manifest(path, root)
    except (IntegrityError, FileNotFoundError) as exc:  # the latter: no manifest
        raise IntegrityError(f"refusing the shipped anatomy table {path}: {exc} (regenerate it with "
                             "dtrlab ship anatomy, or restore it with git)") from None
    return pd.read_csv(path)
