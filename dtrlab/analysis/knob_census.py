"""Census of torch.compile's activation-memory knob: where lowering it raises the peak, and which knob fits a byte budget.

``torch._functorch.config.activation_memory_budget`` (0..1) asks the min-cut partitioner to
keep at most that fraction of the saved-activation memory it would otherwise save. The
partitioner's own objective moves as asked; the step's peak in bytes need not
(pytorch/pytorch#197838: 0.15 -> 0.05 raised a llama step's peak 4.17x). A user has a
budget in bytes, so the useful questions are, per accounting of the peak (flat bytes,
the caching allocator's allocated and reserved bytes):

* where the peak moves *against* the knob (a lower knob, a higher peak) and the
  **non-monotone regions** (knobs where some larger knob gives a strictly lower peak);
* for every byte budget, the knob values that fit (peak <= budget) and the **holes**:
  knobs that do not fit although a smaller and a larger knob both fit;
* the smallest byte budget the knob can reach, and the **bytes-to-knob map**: the
  largest knob that fits a budget, and whether every smaller knob fits too.

Method (:func:`census_knob`): evaluate a grid (0..1 every 0.01 by default), then bisect
every pair of neighbouring samples whose peaks differ under any accounting until
neighbours with different peaks are at most ``resolution`` apart (1e-4 by default).
Every step change and every edge where the peak moves against the knob is thus located
to within the resolution. The peak is taken as constant between neighbours with equal
peaks; that is the limit: a feature narrower than the grid step whose two neighbouring
grid samples have equal peaks (a spike that rises and falls back between two grid knobs)
is not seen. What is guaranteed: every reported peak, change, region and hole is made of
evaluated knobs (nothing is interpolated), and every change between differing grid
neighbours is bracketed to within the resolution (:meth:`KnobCensus.check_resolution`).

The census takes an evaluation function ``knob -> dict`` (the capture's per-knob
partition and replay, :func:`dtrlab.memory.partitioned.knob_peaks` bound to a joint
graph), so it runs on planted curves in the tests; :func:`analyse` recomputes every
table from the samples alone, which is how shipped censuses are read back.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..memory.device import PEAK_ACCOUNTINGS

from ..integrity import (IntegrityError, atomic_write_bytes, atomic_write_json, read_json, sha256_bytes,
                         verify_in_manifest)

#: The peak columns the census reads, one per accounting of the step's memory.
ACCOUNTINGS = tuple(PEAK_ACCOUNTINGS.values())
#: The tables a written census holds, each as ``<name>-<table>.parquet``.
TABLES = ("samples", "changes", "regions", "holes", "knob_map")
CENSUS_FORMAT = "dtrlab-knob-census-1"
#: Which neighbours :func:`census_knob` bisects: every pair whose peaks differ, or only those where the
#: peak moves against the knob.
REFINE_MODES = ("changes", "against")
#: Knob values are rounded to this many decimals (grid values print as 0.05, not 0.05000000000000001).
KNOB_DECIMALS = 12


@dataclass(frozen=True)
class KnobPlan:
    """The knob values to evaluate: ``low..high`` every ``step`` (or the listed ``knobs``), each pair of
    neighbours with different peaks bisected down to ``resolution``; ``max_evaluations`` bounds the work.
    ``refine="against"`` bisects only the pairs where the peak moves against the knob (the lower knob has
    the higher peak under some accounting): the edges where non-monotone regions and holes end, for a
    fraction of the evaluations when the peak changes at most grid steps; other edges stay at the grid step."""

    low: float = 0.0
    high: float = 1.0
    step: float = 0.01
    resolution: float = 1e-4
    knobs: tuple[float, ...] | None = None
    accountings: tuple[str, ...] = ACCOUNTINGS
    max_evaluations: int = 5000
    refine: str = "changes"

    def __post_init__(self):
        values = [self.low, self.high, *(self.knobs or ())]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= 1 for v in values):
            raise ValueError(f"knob values are fractions in [0, 1] (activation_memory_budget), got {values}")
        if self.low > self.high:
            raise ValueError(f"the knob range runs from low to high, got {self.low}:{self.high}")
        if not (math.isfinite(self.step) and self.step > 0):
            raise ValueError(f"the knob step must be > 0, got {self.step}")
        if not (math.isfinite(self.resolution) and self.resolution > 0):
            raise ValueError(f"the resolution must be > 0, got {self.resolution}")
        if self.refine not in REFINE_MODES:
            raise ValueError(f"refine is one of {', '.join(REFINE_MODES)}, got {self.refine!r}")

    def grid(self) -> list[float]:
        if self.knobs is not None:
            return sorted({round(float(k), KNOB_DECIMALS) for k in self.knobs})
        count = int(math.floor((self.high - self.low) / self.step + 1e-9))
        values = {round(self.low + i * self.step, KNOB_DECIMALS) for i in range(count + 1)}
        values.add(round(self.high, KNOB_DECIMALS))
        return sorted(values)

    def describe(self) -> str:
        where = ",".join(f"{k:g}" for k in self.grid()) if self.knobs is not None else \
            f"{self.low:g}:{self.high:g}:{self.step:g}"
        edges = "every change" if self.refine == "changes" else "every change against the knob"
        return f"{where}, {edges} refined to {self.resolution:g}"

    def needs_refining(self, below: dict, above: dict) -> bool:
        """Whether neighbours with these rows are bisected (when further apart than the resolution)."""
        if self.refine == "against":
            return any(below[c] > above[c] for c in self.accountings)
        return any(below[c] != above[c] for c in self.accountings)


#: Each backend's default plan (``--knobs``, ``--resolution``, ``--refine``) for ``dtrlab knob`` and ``dtrlab ship
#: knob``: aot_eager's every 0.01, every change bisected to 1e-4; Inductor's every 0.1, each change against the knob
#: bisected to 0.025, since each distinct partition costs a lowering (seconds on a small model, about 20 s a lowering
#: on the 12-layer GPT-2: docs/compile.md).
DEFAULT_PLANS = {"aot_eager": {"knobs": "0:1:0.01", "resolution": 1e-4, "refine": "changes"},
                 "inductor": {"knobs": "0:1:0.1", "resolution": 0.025, "refine": "against"}}


def parse_knobs(text: str) -> dict:
    """``START:STOP:STEP`` (e.g. ``0:1:0.01``) or a list ``0.05,0.15`` as :class:`KnobPlan` fields."""
    text = text.strip()
    try:
        if ":" in text:
            parts = [float(p) for p in text.split(":")]
            if len(parts) != 3:
                raise ValueError
            low, high, step = parts
            fields = {"low": low, "high": high, "step": step}
        else:
            knobs = tuple(float(p) for p in text.split(","))
            fields = {"low": min(knobs), "high": max(knobs), "knobs": knobs}
    except ValueError:
        raise ValueError(f"expected START:STOP:STEP such as 0:1:0.01, or a list such as 0.05,0.15; got {text!r}") \
            from None
    KnobPlan(**fields)  # the range's own checks, with their messages
    return fields


@dataclass(frozen=True)
class KnobChoice:
    """What the census says about one byte budget under one accounting."""

    budget: int
    accounting: str
    largest_fitting_knob: float | None  # None: no evaluated knob fits
    smallest_fitting_knob: float | None
    lowering_is_safe: bool  # every evaluated knob at or below the largest fitting one fits
    holes: tuple[tuple[float, float], ...]  # (first, last) evaluated knob of each hole

    def describe(self) -> str:
        """One phrase: the largest knob that fits and whether lowering it from there is safe."""
        if self.largest_fitting_knob is None:
            return "no knob value fits"
        text = f"largest knob that fits {self.largest_fitting_knob:g}"
        if self.lowering_is_safe:
            return text + "; every smaller knob fits too"
        holes = ", ".join(f"{a:g}..{b:g}" for a, b in self.holes)
        return text + "; lowering it is NOT safe: " + (f"knobs {holes} do not fit" if holes else
                                                       f"knobs below {self.smallest_fitting_knob:g} do not fit")


@dataclass
class KnobCensus:
    """One model's census. ``samples``: one row per evaluated knob (``source`` grid or refine) with the
    evaluation's columns; ``changes``: neighbours whose peaks differ (``against``: the lower knob has the
    higher peak); ``regions``: runs of knobs some larger knob beats; ``holes``: per budget level (budgets
    ``budget_from..budget_to``) the runs of knobs that do not fit between knobs that do; ``knob_map``: per
    budget level the largest and smallest fitting knob; ``summary``: one row per accounting."""

    name: str
    plan: KnobPlan
    samples: pd.DataFrame
    changes: pd.DataFrame
    regions: pd.DataFrame
    holes: pd.DataFrame
    knob_map: pd.DataFrame
    summary: pd.DataFrame
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    def curve(self, accounting: str) -> tuple[list[float], list[int]]:
        return self.samples["knob"].tolist(), self.samples[accounting].astype("int64").tolist()

    def knob_for_budget(self, budget: int, accounting: str = "allocated_peak") -> KnobChoice:
        """The bytes-to-knob map at one budget."""
        knobs, peaks = self.curve(accounting)
        return _choice(knobs, peaks, int(budget), accounting)

    def check_resolution(self) -> list[tuple[str, float, float]]:
        """Neighbours the plan refines (with different peaks, or with the peak against the knob) that are
        further apart than the resolution: empty when it is honoured, unless the evaluation limit stopped
        the refinement."""
        wide = []
        against = self.plan.refine == "against"
        for accounting in self.plan.accountings:
            knobs, peaks = self.curve(accounting)
            wide += [(accounting, a, b) for a, b, pa, pb in zip(knobs, knobs[1:], peaks, peaks[1:])
                     if (pa > pb if against else pa != pb) and b - a > self.plan.resolution]
        return wide


def census_knob(evaluate: Callable[[float], dict], plan: KnobPlan = KnobPlan(), name: str = "",
                execution=None) -> KnobCensus:
    """Evaluate ``plan``'s grid, bisect every change down to the resolution, and analyse (module docstring).

    ``execution`` (:class:`dtrlab.sweep.execution.Execution`, default serial with no progress bar): each
    batch of knobs (the grid, then each round of midpoints) is evaluated where it says
    (:class:`dtrlab.sweep.engine.Workers`), ``evaluate`` given to each worker once: ``fork`` processes
    inherit it (a traced graph bound into it is shared, not pickled; POSIX only), ``loky`` and ``dask``
    workers receive it pickled, so there it should be a :class:`KnobSource` (the model source's spec, a
    few hundred bytes: each worker traces the joint once and evaluates many knobs) or another picklable
    callable. A :class:`KnobSource` is traced here before a fork, so forked workers trace nothing. The
    samples do not depend on the backend; ``meta`` records it, the worker processes and, for a
    :class:`KnobSource`, how often each traced the joint (``traces_per_process``: 1 each)."""
    from ..sweep.engine import Workers, placement
    from ..sweep.execution import SERIAL

    execution = execution or SERIAL.with_(progress=False)
    where = placement(execution)
    started = time.perf_counter()
    if isinstance(evaluate, KnobSource):
        evaluate = evaluate.resolved()  # its lowering cache named here, whatever the workers' environment
    if isinstance(evaluate, KnobSource) and where in ("sequential", "fork"):
        evaluate.joint()  # traced here, before the bar (and before the fork)
    elif where in ("loky", "dask"):
        _check_shippable(evaluate, where)
    # Workers share lowerings through the disk cache only: each distinct partition goes to one worker first.
    dedupe = isinstance(evaluate, KnobSource) and evaluate.shares_lowerings and where != "sequential"
    rows: dict[float, dict] = {}
    processes: dict[int, tuple] = {}
    lowered_keys: set[str] = set()
    bar = _progress_bar(execution.progress, len(plan.grid()), name)
    with Workers(_evaluate_knob, evaluate, execution) as workers:
        batch, source = plan.grid()[:plan.max_evaluations], "grid"
        while batch:
            for phase in _lowering_phases(workers, batch, lowered_keys) if dedupe else [batch]:
                for index, (row, pid, counts) in workers.imap([("row", knob) for knob in phase]):
                    _check_row(row, phase[index], plan.accountings)
                    rows[phase[index]] = {**row, "knob": phase[index], "source": source}
                    processes[pid] = counts
                    if bar is not None:
                        bar.update(1)
            batch, source = _midpoints(rows, plan)[:plan.max_evaluations - len(rows)], "refine"
            if bar is not None and batch:
                bar.total += len(batch)
                bar.refresh()
    if bar is not None:
        bar.close()
    samples = pd.DataFrame([rows[k] for k in sorted(rows)])
    census = analyse(samples, plan, name)
    census.seconds = time.perf_counter() - started
    census.meta.update(refinement_complete=not census.check_resolution(), jobs=execution.jobs, execution=where,
                       processes=len(processes))
    if isinstance(evaluate, KnobSource):
        census.meta["traces_per_process"] = [processes[pid][0] for pid in sorted(processes)]
        if evaluate.backend == "inductor":
            census.meta["lowered_per_process"] = [processes[pid][1] for pid in sorted(processes)]
    if "backend" in samples:  # whose step the peaks are of (dtrlab.memory.partitioned.knob_peaks)
        census.meta["backend"] = ",".join(sorted(set(samples["backend"])))
    if "inductor" in census.meta.get("backend", ""):
        options = dict(evaluate.options) if isinstance(evaluate, KnobSource) else {}
        note_lowering(census.meta, options.get("gpu") or options.get("device", "cpu"))
    return census


def note_lowering(meta: dict, lowered_for: str) -> None:
    """An Inductor census's lowering in its ``meta``: ``inductor_lowering`` (``cpu``, or the GPU's name: CUDA
    Inductor's lowering) and the one line a GPU user reads with it (``gpu_answer``). :func:`census_knob` notes it
    for a :class:`KnobSource`; a caller evaluating a traced joint itself (``dtrlab ship knob``) notes its own."""
    meta["inductor_lowering"] = str(lowered_for)
    meta["gpu_answer"] = gpu_answer(meta)


#: What an Inductor census lowered for the CPU is worth for a GPU step, with the uncertainty measured on CPU
#: (tests/test_inductor.py, docs/compile.md "Checked against real Inductor steps").
CPU_INDUCTOR_ANSWER = (
    "Inductor accounting: CPU Inductor's lowering (give --device with a GPU, e.g. H100-80GB, for CUDA Inductor's "
    "lowering on fake tensors, not yet measured on a GPU); measured against real CPU steps it is exact to within one "
    "tensor on a decoder, an encoder-decoder, a ViT, ResNet-18 and MobileNetV3 (their convolutions' oneDNN "
    "temporaries measured and counted); CUDA Inductor lowers attention, convolutions and fusions differently, so a "
    "GPU step's peak can differ by more")


def gpu_answer(meta: dict) -> str | None:
    """The one line an Inductor census lowered for the CPU carries for a GPU user (:data:`CPU_INDUCTOR_ANSWER`),
    None for an aot_eager census or one lowered for a GPU (``inductor_lowering``: its name,
    dtrlab.trace.torch_compile.cuda_joint). A census that does not name its lowering device is the CPU's."""
    if "inductor" not in meta.get("backend", "") or meta.get("inductor_lowering", "cpu") != "cpu":
        return None
    return CPU_INDUCTOR_ANSWER


#: What an Inductor census lowered for a GPU (``{gpu}``) says of its lowering.
CUDA_INDUCTOR_ANSWER = ("Inductor accounting: CUDA Inductor's lowering for {gpu}, on fake tensors without a GPU "
                        "(dtrlab.trace.torch_compile.cuda_joint; not yet measured on a GPU; what a convolution's "
                        "cuDNN workspace takes is not counted)")


def lowering_answer(meta: dict) -> str | None:
    """The one line that says which Inductor lowering a census (its ``meta``) used: :func:`gpu_answer` for the
    CPU's, :data:`CUDA_INDUCTOR_ANSWER` for a GPU's; None for an aot_eager census (nothing lowered)."""
    if "inductor" not in meta.get("backend", ""):
        return None
    return gpu_answer(meta) or CUDA_INDUCTOR_ANSWER.format(gpu=meta["inductor_lowering"])


def _check_shippable(evaluate, where: str) -> None:
    """A one-line error, before any worker starts, for an ``evaluate`` that cannot travel to ``where``'s workers
    (a traced joint bound into a closure holds objects pickle refuses)."""
    import cloudpickle  # loky's and Dask's own pickler (a dependency of both)

    try:
        cloudpickle.dumps(evaluate)
    except Exception as exc:  # pickle's refusals have no common type (TypeError, PicklingError, AttributeError)
        raise ValueError(f"census_knob on {where} ships evaluate to each worker, and this one cannot be pickled "
                         f"({type(exc).__name__}: {exc}); give a KnobSource (the model source's spec, traced once "
                         "per worker) or use backend='fork'") from None


def _evaluate_knob(evaluate: Callable[[float], dict], task: tuple[str, float]):
    """One knob, in whichever process. ``("row", knob)``: (the row, this process's id, and for a
    :class:`KnobSource` how often this process has traced its joint and how many partitions it has lowered, else
    None). ``("key", knob)``: the disk key of the knob's lowering (:meth:`KnobSource.lowering_key`)."""
    what, knob = task
    if what == "key":
        return evaluate.lowering_key(knob)
    row = dict(evaluate(knob))
    counts = (evaluate.traces_here(), evaluate.lowered_here()) if isinstance(evaluate, KnobSource) else None
    return row, os.getpid(), counts


def _lowering_phases(workers, batch: list[float], lowered: set[str]) -> list[list[float]]:
    """``batch`` split so that no partition is lowered by two workers at once: the workers first find each knob's
    lowering key (a partition each, nothing lowered), then the first knob (in batch order) of each key not lowered
    before goes out, and the other knobs after, when their lowerings are on disk. ``lowered`` (the keys sent out
    in earlier batches) grows by this batch's."""
    keys: list[str | None] = [None] * len(batch)
    for index, key in workers.imap([("key", knob) for knob in batch]):
        keys[index] = key
    first: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key not in lowered and key not in first:
            first[key] = index
    lowered.update(first)
    leaders = set(first.values())
    phases = [[batch[i] for i in sorted(leaders)], [knob for i, knob in enumerate(batch) if i not in leaders]]
    return [phase for phase in phases if phase]


@dataclass(frozen=True)
class KnobSource:
    """A model source's knob evaluation as a small value: what :func:`~dtrlab.trace.torch_compile.tracing.trace_joint`
    traces (``source`` and its keyword ``options`` as sorted pairs, ``backend``) and how each knob is
    evaluated (``solver`` and ``runtime_estimator``; ``watched``: count the knapsack's calls over its
    limit, :func:`dtrlab.analysis.knob_solvers.watched_peaks`). Calling it with a knob traces the joint
    the first time in a process (a per-process memo holds the last joint traced) and returns the knob's
    row. This, not the traced graph, is what :func:`census_knob` ships to loky and Dask workers.
    Evaluations in one process take a lock: torch's partitioner configuration is global to a process,
    and a Dask worker may run several calls at once in threads."""

    source: str
    options: tuple[tuple[str, object], ...] = ()
    backend: str = "inductor"
    solver: str | None = None
    runtime_estimator: str | None = None
    watched: bool = False
    #: Where Inductor's lowered steps are kept across runs (:func:`dtrlab.memory.partitioned.knob_peaks`'s
    #: ``cache``: True for ``$DTRLAB_CACHE``, a directory, or False).
    cache: bool | str = True

    def resolved(self) -> "KnobSource":
        """This source with its lowering cache as a directory (True: this process's ``$DTRLAB_CACHE``), so that
        workers started under another environment (a reused loky executor, a Dask cluster) use the same one."""
        if self.cache is True:
            from ..trace.cache import default_cache_dir

            return dataclasses.replace(self, cache=str(default_cache_dir()))
        return self

    @property
    def shares_lowerings(self) -> bool:
        """Whether processes evaluating this source share Inductor's lowerings (through the disk cache)."""
        return self.backend == "inductor" and bool(self.cache)

    @property
    def joint_key(self) -> tuple:
        return self.source, self.options, self.backend

    def joint(self):
        """The traced joint graph (traced once per process, held until another source is traced)."""
        with _JOINT_LOCK:
            return self._joint()

    def _joint(self):
        key = self.joint_key
        if _JOINT_MEMO.get("key") != key:
            from ..trace.torch_compile.tracing import trace_joint

            _JOINT_MEMO.clear()  # one joint at a time: a traced graph holds the whole step
            _JOINT_TRACES[key] = _JOINT_TRACES.get(key, 0) + 1
            _JOINT_MEMO.update(key=key, joint=trace_joint(self.source, backend=self.backend, **dict(self.options)))
        return _JOINT_MEMO["joint"]

    def traces_here(self) -> int:
        """How many times this process has traced this source's joint (1 once it has been evaluated)."""
        return _JOINT_TRACES.get(self.joint_key, 0)

    def lowered_here(self) -> int:
        """How many distinct partitions this process has lowered on the joint it holds (Inductor's; read from
        the disk cache, a partition is not lowered)."""
        if _JOINT_MEMO.get("key") != self.joint_key:
            return 0
        joint = _JOINT_MEMO["joint"]
        return sum(len(part.lowerings) for part in joint.parts or (joint,))

    def lowering_key(self, knob: float) -> str:
        """The disk key of this source's Inductor lowering at ``knob``
        (:func:`dtrlab.trace.torch_compile.inductor.lowering_key`)."""
        from ..trace.torch_compile.inductor import lowering_key
        from ..trace.torch_compile.partition import partitioner_config

        with _JOINT_LOCK, partitioner_config(None, runtime_estimator=self.runtime_estimator):
            return lowering_key(self._joint(), knob, solver=self.solver)

    def __call__(self, knob: float) -> dict:
        from ..memory.partitioned import knob_peaks
        from .knob_solvers import watched_peaks

        lowerings = {"cache": self.cache} if self.backend == "inductor" else {}  # aot_eager lowers nothing
        with _JOINT_LOCK:
            joint = self._joint()
            if not self.watched:
                return knob_peaks(joint, knob, solver=self.solver, **lowerings)
            return watched_peaks(joint, knob, solver=self.solver, runtime_estimator=self.runtime_estimator,
                                 **lowerings)


#: This process's traced joint (``key``, ``joint``), the count of traces per joint key, and the lock that
#: serialises tracing and evaluation in the process (see :class:`KnobSource`).
_JOINT_MEMO: dict = {}
_JOINT_TRACES: dict[tuple, int] = {}
_JOINT_LOCK = threading.RLock()


def _progress_bar(progress: bool, total: int, name: str):
    if not progress:
        return None
    from ..progress import progress_bar

    return progress_bar(total=total, desc=f"knob {name}".strip(), unit="knob")


def _check_row(row: dict, knob: float, accountings: tuple[str, ...]) -> None:
    for accounting in accountings:
        value = row.get(accounting)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"the evaluation at knob {knob} gave {accounting}={value!r}; expected bytes >= 0")


def _midpoints(rows: dict[float, dict], plan: KnobPlan) -> list[float]:
    """The midpoint of every pair of neighbours whose peaks differ under some accounting and that are
    more than the resolution apart."""
    knobs = sorted(rows)
    midpoints = []
    for a, b in zip(knobs, knobs[1:]):
        if b - a > plan.resolution and plan.needs_refining(rows[a], rows[b]):
            midpoint = round((a + b) / 2, KNOB_DECIMALS)
            if a < midpoint < b:
                midpoints.append(midpoint)
    return midpoints


def analyse(samples: pd.DataFrame, plan: KnobPlan, name: str = "") -> KnobCensus:
    """Every table of the census from its samples (columns ``knob`` and the plan's accountings)."""
    samples = samples.sort_values("knob", ignore_index=True)
    changes, regions, holes, knob_map, summary = [], [], [], [], []
    for accounting in plan.accountings:
        knobs = samples["knob"].astype(float).tolist()
        peaks = samples[accounting].astype("int64").tolist()
        changes += [{"accounting": accounting, **c} for c in _changes(knobs, peaks)]
        found_regions = _regions(knobs, peaks)
        regions += [{"accounting": accounting, **r} for r in found_regions]
        levels = _levels(knobs, peaks)
        holes += [{"accounting": accounting, **h} for h in levels["holes"]]
        knob_map += [{"accounting": accounting, **m} for m in levels["map"]]
        summary.append({"accounting": accounting, **_summary(knobs, peaks, found_regions, levels)})
    columns = {
        "changes": ["accounting", "knob_below", "knob_above", "peak_below", "peak_above", "against"],
        "regions": ["accounting", "knob_from", "knob_to", "peak_max", "beaten_by_knob", "beaten_by_peak", "rise"],
        "holes": ["accounting", "budget_from", "budget_to", "knob_from", "knob_to", "fits_below", "fits_above"],
        "map": ["accounting", "budget_from", "budget_to", "largest_fitting_knob", "smallest_fitting_knob",
                "holes", "lowering_is_safe"],
    }
    return KnobCensus(name=name, plan=plan, samples=samples,
                      changes=pd.DataFrame(changes, columns=columns["changes"]),
                      regions=pd.DataFrame(regions, columns=columns["regions"]),
                      holes=pd.DataFrame(holes, columns=columns["holes"]),
                      knob_map=pd.DataFrame(knob_map, columns=columns["map"]),
                      summary=pd.DataFrame(summary))


def _changes(knobs: list[float], peaks: list[int]) -> list[dict]:
    return [{"knob_below": a, "knob_above": b, "peak_below": pa, "peak_above": pb, "against": pa > pb}
            for a, b, pa, pb in zip(knobs, knobs[1:], peaks, peaks[1:]) if pa != pb]


def _suffix_minima(peaks: list[int]) -> list[tuple[int, int] | None]:
    """For each index, (lowest peak at a strictly larger knob, the first index reaching it), None for the last."""
    out: list[tuple[int, int] | None] = [None] * len(peaks)
    best: tuple[int, int] | None = None
    for i in range(len(peaks) - 1, -1, -1):
        out[i] = best
        if best is None or peaks[i] <= best[0]:
            best = (peaks[i], i)
    return out


def _regions(knobs: list[float], peaks: list[int]) -> list[dict]:
    """Maximal runs of knobs whose peak some larger knob beats (the knob is not monotone there)."""
    minima = _suffix_minima(peaks)
    beaten = [m is not None and peaks[i] > m[0] for i, m in enumerate(minima)]
    regions, i = [], 0
    while i < len(knobs):
        if not beaten[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(knobs) and beaten[j + 1]:
            j += 1
        peak_max = max(peaks[i:j + 1])
        best_peak, best_index = minima[j]
        regions.append({"knob_from": knobs[i], "knob_to": knobs[j], "peak_max": peak_max,
                        "beaten_by_knob": knobs[best_index], "beaten_by_peak": best_peak,
                        "rise": peak_max / best_peak if best_peak else math.inf})
        i = j + 1
    return regions


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """(first, last) index of each maximal run of True."""
    runs, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i - 1))
            start = None
    return runs


def _levels(knobs: list[float], peaks: list[int]) -> dict:
    """Holes and the bytes-to-knob map at every budget level (the fitting set changes only at a peak value)."""
    levels = sorted(set(peaks))
    holes, knob_map = [], []
    for index, level in enumerate(levels):
        budget_to = levels[index + 1] - 1 if index + 1 < len(levels) else None
        choice = _choice(knobs, peaks, level, "")
        for first, last in choice.holes:
            i, j = knobs.index(first), knobs.index(last)
            holes.append({"budget_from": level, "budget_to": budget_to, "knob_from": first, "knob_to": last,
                          "fits_below": knobs[i - 1], "fits_above": knobs[j + 1]})
        knob_map.append({"budget_from": level, "budget_to": budget_to,
                         "largest_fitting_knob": choice.largest_fitting_knob,
                         "smallest_fitting_knob": choice.smallest_fitting_knob,
                         "holes": len(choice.holes), "lowering_is_safe": choice.lowering_is_safe})
    return {"holes": holes, "map": knob_map}


def _choice(knobs: list[float], peaks: list[int], budget: int, accounting: str) -> KnobChoice:
    fits = [p <= budget for p in peaks]
    fitting = [i for i, f in enumerate(fits) if f]
    if not fitting:
        return KnobChoice(budget, accounting, None, None, False, ())
    low, high = fitting[0], fitting[-1]
    holes = tuple((knobs[a], knobs[b]) for a, b in _runs([not f for f in fits]) if a > low and b < high)
    return KnobChoice(budget, accounting, knobs[high], knobs[low], all(fits[:high + 1]), holes)


def _summary(knobs: list[float], peaks: list[int], regions: list[dict], levels: dict) -> dict:
    """The headline numbers of one accounting: the reachable minimum, the worst rise from lowering the
    knob (the largest peak(k) / peak(k') over k < k'), and counts."""
    minimum = min(peaks)
    at_minimum = [k for k, p in zip(knobs, peaks) if p == minimum]
    worst = (1.0, None, None)
    for i, m in enumerate(_suffix_minima(peaks)):
        if m is not None and m[0] > 0 and peaks[i] / m[0] > worst[0]:
            worst = (peaks[i] / m[0], knobs[i], knobs[m[1]])
    return {"min_peak": minimum, "largest_knob_at_min": max(at_minimum), "smallest_knob_at_min": min(at_minimum),
            "peak_at_lowest_knob": peaks[0], "peak_at_highest_knob": peaks[-1],
            "changes": sum(a != b for a, b in zip(peaks, peaks[1:])),
            "against_changes": sum(a > b for a, b in zip(peaks, peaks[1:])),
            "regions": len(regions), "hole_levels": len({h["budget_from"] for h in levels["holes"]}),
            "worst_rise": worst[0], "worst_rise_knob_low": worst[1], "worst_rise_knob_high": worst[2]}


def write_census(census: KnobCensus, directory: str | os.PathLike) -> list[Path]:
    """Write ``census`` as ``<name>-<table>.parquet`` files and ``<name>.json`` (the plan, the summary, and
    each table's sha256), each file atomically and the JSON last: a reader starts from the JSON and checks
    every table against it, so a census cut short (or a mix of an old and a new one) is never read as whole."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = census.name or "census"
    blobs = {}
    for table in TABLES:
        buffer = io.BytesIO()
        getattr(census, table).to_parquet(buffer, index=False)
        blobs[f"{name}-{table}.parquet"] = buffer.getvalue()
    document = {"format": CENSUS_FORMAT, "name": census.name, "plan": dataclasses.asdict(census.plan),
                "seconds": census.seconds, "meta": census.meta,
                "summary": census.summary.astype(object).where(census.summary.notna(), None).to_dict("records"),
                "files": {file: sha256_bytes(data) for file, data in blobs.items()}}
    paths = []
    for file, data in blobs.items():
        atomic_write_bytes(directory / file, data)
        paths.append(directory / file)
    atomic_write_json(directory / f"{name}.json", document)
    return [*paths, directory / f"{name}.json"]


def read_census(path: str | os.PathLike, manifest_dir: str | os.PathLike | None = None) -> KnobCensus:
    """The census written by :func:`write_census` (``path``: its JSON), its samples checked against the JSON
    and every other table recomputed from them (:func:`analyse`); a damaged file raises IntegrityError.
    With ``manifest_dir`` (``results/shipped``) the JSON and the samples are also checked against its
    MANIFEST.json."""
    path = Path(path)
    if manifest_dir is not None:
        verify_in_manifest(path, manifest_dir)
    document = read_json(path)
    if not isinstance(document, dict) or document.get("format") != CENSUS_FORMAT:
        raise IntegrityError(f"{path} is not a dtrlab knob census ({CENSUS_FORMAT})")
    plan_fields = dict(document["plan"])
    for key in ("knobs", "accountings"):
        if plan_fields.get(key) is not None:
            plan_fields[key] = tuple(plan_fields[key])
    samples_file = f"{document['name'] or 'census'}-samples.parquet"
    if manifest_dir is not None:
        verify_in_manifest(path.parent / samples_file, manifest_dir)
    data = (path.parent / samples_file).read_bytes()
    if sha256_bytes(data) != document["files"].get(samples_file):
        raise IntegrityError(f"{path.parent / samples_file} does not match its sha256 in {path}")
    census = analyse(pd.read_parquet(io.BytesIO(data)), KnobPlan(**plan_fields), document["name"])
    census.seconds, census.meta = document["seconds"], document["meta"]
    return census


def shipped_census_for(path: str | os.PathLike, joint, plan: KnobPlan,
                       manifest_dir: str | os.PathLike | None = None) -> tuple[KnobCensus | None, str]:
    """The census at ``path`` (:func:`write_census`) when it is ``joint``'s own under ``plan``, else None; with why,
    in words, either way.

    It is ``joint``'s own when it was made by the aot_eager accounting of the same joint graph
    (``meta["graph_hash"]``, :func:`dtrlab.trace.torch_compile.joint.joint_hash`: every node, shape, stride and dtype),
    by this torch (``meta["torch_version"]``) and this partitioner configuration (each sample's solver and runtime
    estimator, which ``torch._functorch.config`` sets), on an equal plan: the partitioner then answers every knob
    as it did. A file missing, damaged or not listed in ``manifest_dir``'s MANIFEST.json is not served."""
    import torch
    import torch._functorch.config as functorch_config

    from ..trace.torch_compile.joint import joint_hash

    path = Path(path)
    if not path.is_file():
        return None, f"computed (no shipped census at {path})"
    try:
        census = read_census(path, manifest_dir)
    except (IntegrityError, FileNotFoundError) as error:  # FileNotFoundError: no manifest, or a table missing
        return None, f"computed (the shipped census is not used: {error})"
    meta, samples = census.meta, census.samples
    current = {"solver": functorch_config.activation_memory_budget_solver,
               "runtime_estimator": functorch_config.activation_memory_budget_runtime_estimator}
    for differs, what in ((meta.get("backend") != "aot_eager", "another accounting than aot_eager's"),
                          (meta.get("torch_version") != torch.__version__, f"torch {meta.get('torch_version')}"),
                          (any(set(samples[key]) != {value} for key, value in current.items()),
                           "another partitioner configuration"),
                          (census.plan != plan, "another plan"),
                          (meta.get("graph_hash") != joint_hash(joint), "another joint graph")):
        if differs:
            return None, f"computed ({path.name} is of {what})"
    return census, f"read from {path} (the same joint graph, torch {torch.__version__} and plan)"


#: The DTR semantics that limit the same quantity as each knob accounting: flat bytes, the caching
#: allocator's allocated bytes (the DTR prototype's enforcement) and its reserved bytes.
DTR_SEMANTICS = {"flat_peak": {}, "allocated_peak": {"memory": "caching", "enforce": "allocated"},
                 "reserved_peak": {"memory": "caching"}}


def dtr_beside_knob(census: KnobCensus, trace, accounting: str = "flat_peak", ratios="0.05:1.0:0.01",
                    budgets=None, semantics=None, execution=None) -> pd.DataFrame:
    """At each byte budget: does some knob value fit (and the largest that does, with its recompute FLOPs),
    does DTR pass on ``trace`` (the same step, captured by :func:`dtrlab.trace.capture.capture`) and at what
    recompute, and does ``monotone(dtr)`` pass (flat memory only: its guarantee needs it; None otherwise).

    The budgets are ``ratios`` of the trace's unbounded peak (simrd's ``int(peak * ratio)``, so shipped DTR
    sweeps answer them), or ``budgets`` in bytes. ``semantics`` default to the DTR semantics that limit the
    same quantity as ``accounting`` (:data:`DTR_SEMANTICS`); ``execution`` to a serial, cached run.
    Overheads are (step compute + recompute) / step compute, the step compute being the trace's baseline:
    ``dtr_overhead`` and ``monotone_overhead`` from the runs, ``knob_overhead`` from the partition's recompute
    FLOPs, comparable with DTR's when the trace's costs are FLOPs (``dtrlab capture --cost flops``, the
    capture's FLOP model, which the partition's recompute FLOPs also use)."""
    from ..runtime import baseline, budget_for
    from ..runtime.semantics import Semantics
    from ..sweep import sweep
    from ..sweep.budget_sweep import parse_ratios
    from ..sweep.execution import SERIAL

    semantics = semantics or Semantics(**DTR_SEMANTICS[accounting])
    execution = execution or SERIAL
    knobs, peaks = census.curve(accounting)
    if budgets is None:
        budgets = [budget_for(trace, ratio) for ratio in parse_ratios(ratios)]
    budgets = sorted({int(b) for b in budgets})
    run_options = dict(budgets=budgets, semantics=semantics, execution=execution)
    dtr = sweep(trace, "dtr", **run_options).set_index("budget_bytes")
    flat = semantics.memory == "flat"
    monotone = sweep(trace, "monotone", **run_options).set_index("budget_bytes") if flat else None
    samples = census.samples.set_index("knob")
    compute = baseline(trace).model_compute
    rows = []
    for budget in budgets:
        choice = _choice(knobs, peaks, budget, accounting)
        knob = choice.largest_fitting_knob
        rows.append({
            "budget_bytes": budget, "knob_fits": knob is not None, "largest_fitting_knob": knob,
            "knob_lowering_is_safe": choice.lowering_is_safe,
            "knob_recompute_flops": samples.at[knob, "recompute_flops"] if knob is not None and
            "recompute_flops" in samples else math.nan,
            "knob_overhead": 1 + samples.at[knob, "recompute_flops"] / compute if knob is not None and
            "recompute_flops" in samples else math.nan,
            "dtr_status": dtr.at[budget, "status"], "dtr_remat_compute": dtr.at[budget, "remat_compute"],
            "dtr_overhead": dtr.at[budget, "overhead"],
            "monotone_status": monotone.at[budget, "status"] if flat else None,
            "monotone_overhead": monotone.at[budget, "overhead"] if flat else math.nan})
    return pd.DataFrame(rows)
