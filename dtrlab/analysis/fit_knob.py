"""A byte budget for torch.compile: the ``activation_memory_budget`` knob that fits it, found cheaply, with warnings.

::

    fit = dtrlab.fit_knob(model, (tokens,), loss_fn, budget="A100-80GB")
    print(fit.describe())      # the knob, its margin and recompute, what lies below it, the warnings
    fit.knob                   # None when no knob value fits

:func:`fit_knob` traces the training step once (:func:`~dtrlab.trace.torch_compile.tracing.trace_step`, the
work behind ``dtrlab knob``: dynamo fakes the live model and inputs, no step runs and nothing is
allocated; for another ``device``, a fake copy there, :func:`~dtrlab.trace.torch_compile.tracing.fake_module`)
and asks torch's own partitioner only what the budget needs (:func:`search_budget`), not a full census:

1. knob 1.0 and 0.99 (the cliff: at 1.0 the partitioner skips its knapsack), and a coarse
   scan of the census grid (0..1 every 0.01) every ``SCAN_STEP`` (0.2: knobs 0, 0.2, ... 0.8);
2. bisection on the grid between the largest scanned knob that fits and the next scanned
   knob above it: the grid knob just above the answer does not fit, so the answer is the
   largest at the grid's resolution *locally*. A knob above it that fits again between two
   failing scanned knobs (a hole above the answer narrower than the scan) is not seen: that
   is a census's job (``dtrlab knob``);
3. below the answer, a bisection of every edge between fitting and failing evaluated knobs
   down to the grid: the holes below the answer and whether lowering it is safe, *at the
   scan's resolution* (a hole narrower than the scan step between two fitting scanned knobs
   is not seen).

The smallest peak reported is the smallest among the knobs evaluated (the scan and the
bisections), not a census's minimum.

At the answer it says what a user must know: recomputed random operators (pytorch#190758:
below 1.0 a recomputed dropout draws fresh randomness, so the gradients are silently wrong),
the cliff between 1.0 and 0.99, and, when no evaluated knob fits, what DTR and
``monotone(dtr)`` do at that budget on the same model's eager capture.

The answer is cached (``$DTRLAB_CACHE/fit_knob``, JSON written atomically, its record's
sha256 checked on every read; a damaged entry is moved aside and recomputed) under the
traced graph's content hash, the torch version, the accounting, the backend, the solver,
the runtime estimator, the search's grid and the budget: a second call traces the step again (to
hash it) and reads the answer. :func:`dtrlab.compile` also keeps the answer under the model's fingerprint,
so that a second run of a training script reads it without tracing (:mod:`dtrlab.analysis.knob_compile`).

Accounting: ``backend="inductor"`` (the default: Inductor's own lowering of each partition,
:mod:`dtrlab.trace.torch_compile.inductor`) or ``"aot_eager"`` (the partitioned graphs run node by node), both through
:func:`dtrlab.memory.partitioned.knob_peaks` (a step with graph breaks graph by graph, under either).
The lowering is the one ``dtrlab knob --device`` takes: a GPU preset as ``device`` (``"H100-80GB"``) traces the
step for that GPU and lowers it with CUDA Inductor on fake tensors (:mod:`dtrlab.trace.torch_compile.cuda_joint`, no GPU
needed); a live model on CUDA with no other device named, the same for this machine's GPU (the target its
properties match); anything else, the CPU's. The answer names it (:attr:`KnobFit.lowering`) and its cache key holds it.
The accounting of the peak is flat,
allocated or reserved bytes, reserved by default for a GPU preset (what the device
enforces), allocated otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..integrity import IntegrityError, atomic_write_json, quarantine, read_json
from ..memory.device import PEAK_ACCOUNTINGS, budget_bytes, gpu_preset, human_bytes
from ..suggest import did_you_mean
from ..trace import op_temporaries
from ..trace.torch_compile.joint import BACKENDS
from ..trace.torch_compile.record import RECORDING_VERSION
from .knob_census import ACCOUNTINGS, KNOB_DECIMALS, KnobPlan, lowering_answer

#: A cliff worth a warning: the peaks at 1.0 and 0.99 differ by more than this fraction.
CLIFF_WARNING = 0.01
#: In every cache key: a new format (here, the checksum's fields) is never read as an old one's entry.
FIT_FORMAT = "dtrlab-fit-knob-3"
#: The scan's knob step (docs/compile.md, "Budget in bytes": 0.2 meets a tenth of a census on the full models).
SCAN_STEP = 0.2
#: How a cached answer was found (:attr:`KnobFit.from_cache`), as :meth:`KnobFit.describe` says it.
#: The unit of the partitioner's runtime estimate under each estimator (torch's estimate_runtime,
#: torch/_functorch/partitioners.py:3401): "testing" counts 1 per operator (:3416-3417), "profile" benchmarks
#: milliseconds on a GPU (:3419-3426), "flops" counts FLOPs, at least 1 per operator (:3428-3437).
ESTIMATE_UNITS = {"flops": "FLOPs", "profile": "ms", "testing": "operators"}
CACHE_MATCHES = {"graph": "cached answer, found by the traced graph's hash",
                 "fingerprint": "cached answer, found by the model's fingerprint without tracing; checked against "
                                "the graphs torch compiles"}


@dataclass(frozen=True)
class KnobFit:
    """:func:`fit_knob`'s answer for one model and one byte budget (bytes are ints; knobs grid values)."""

    source: str
    budget: int
    accounting: str
    backend: str
    solver: str
    runtime_estimator: str
    #: The largest knob that fits (its grid neighbour above does not), or None when no evaluated knob fits.
    knob: float | None
    peak: int | None
    margin: int | None
    #: What the choice recomputes: FLOPs (capture's FLOP model) and the partitioner's runtime estimate.
    recompute_flops: int | None
    recompute_runtime: float | None
    #: Every evaluated knob at or below the choice fits (at the scan's resolution).
    lowering_is_safe: bool
    #: (first, last) evaluated knob of each failing run below the choice with a fitting knob below it.
    holes: tuple[tuple[float, float], ...]
    #: The largest knob below which no evaluated knob fits (None: the lowest evaluated one fits).
    fails_below: float | None
    min_peak_knob: float
    min_peak: int
    peak_at_1: int
    peak_at_099: int
    #: Forward random operators the choice recomputes in the backward (pytorch#190758), by joint-graph name.
    recomputed_random: tuple[str, ...]
    #: When no knob fits: DTR's and monotone(dtr)'s outcome at the budget on the eager capture (or why not).
    instead: dict | None
    #: Every evaluated (knob, peak), in knob order.
    evaluated: tuple[tuple[float, int], ...]
    seconds: float
    graph_hash: str
    torch_version: str
    #: What the step was traced and lowered for: "cpu", or a GPU preset (CUDA Inductor's lowering for it).
    lowering: str = "cpu"
    #: Not part of the record: None when searched in this call, else how the cached answer was found:
    #: "graph" (the traced graph's hash) or "fingerprint" (dtrlab.compile: the model's, no trace).
    from_cache: str | None = None

    @property
    def evaluations(self) -> int:
        return len(self.evaluated)

    @property
    def cliff(self) -> float:
        """The peak at knob 1.0 over the peak at 0.99 (the knapsack skipped against run)."""
        return self.peak_at_1 / self.peak_at_099 if self.peak_at_099 else math.inf

    def warnings(self) -> list[str]:
        """What a user must know at this choice, one line each."""
        found = []
        if self.recomputed_random:
            names = ", ".join(self.recomputed_random[:4]) + (f" and {len(self.recomputed_random) - 4} more"
                                                             if len(self.recomputed_random) > 4 else "")
            found.append(f"knob {self.knob:g} recomputes {len(self.recomputed_random)} random operators ({names}): "
                         "below 1.0 the recompute draws fresh randomness, so the gradients are silently wrong "
                         "(pytorch/pytorch#190758)")
        if abs(self.cliff - 1) > CLIFF_WARNING and self.knob is not None and self.knob >= 0.99:
            found.append(f"cliff: the peak at knob 1.0 (knapsack skipped) is {human_bytes(self.peak_at_1)}, "
                         f"{self.cliff:.2f}x the {human_bytes(self.peak_at_099)} at 0.99")
        if self.knob is None:
            found.append(f"no knob fits {human_bytes(self.budget)}: the smallest peak found is "
                         f"{human_bytes(self.min_peak)} (knob {self.min_peak_knob:g})"
                         + (f"; instead: {_instead(self.instead)}" if self.instead else ""))
        elif not self.lowering_is_safe:
            below = ", ".join(f"{a:g}..{b:g}" for a, b in self.holes)
            found.append("lowering the knob is NOT safe: " + "; ".join(
                part for part in (f"holes at {below}" if below else "",
                                  f"no knob at or below {self.fails_below:g} fits"
                                  if self.fails_below is not None else "") if part))
        return found

    def describe(self) -> str:
        """The choice in plain lines: what fits, what it costs, what lies below, the warnings."""
        head = (f"{self.source}: budget {human_bytes(self.budget)} ({self.budget:,} bytes, {_short(self.accounting)}, "
                f"{self.backend} graphs for {self.lowering}, solver {self.solver}, estimator {self.runtime_estimator})")
        lines = [head]
        answer = lowering_answer({"backend": self.backend, "inductor_lowering": self.lowering})
        if answer is not None:
            lines.append(answer)
        if self.knob is not None:
            lines.append(f"knob {self.knob:g}: predicted peak {human_bytes(self.peak)}, "
                         f"margin {human_bytes(self.margin)}; "
                         f"recomputes {self.recompute_flops:,} FLOPs (partitioner's estimate "
                         f"{self.recompute_runtime:.4g} {_estimate_unit(self.runtime_estimator)}); "
                         f"{_above(self.knob)}")
            if self.lowering_is_safe:
                lines.append("every smaller knob evaluated fits too")
        lines.append(f"smallest peak found: {human_bytes(self.min_peak)} at knob {self.min_peak_knob:g}; "
                     f"{self.evaluations} knob values evaluated in {self.seconds:.1f} s"
                     + (f" ({CACHE_MATCHES[self.from_cache]})" if self.from_cache else ""))
        lines += [f"WARNING: {w}" for w in self.warnings()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "from_cache"}


def spread_budgets(probe: KnobFit) -> tuple[int, int, int]:
    """Three budgets for proving picks on a real step, from a ``probe`` fitted at a budget every knob fits: the
    smallest evaluated peak, and the middle and three quarters up to the largest one, or to just below the peak
    at knob 1.0 when that is lower (a budget at or above it picks 1.0, with no grid knob above to check)."""
    low, high = probe.min_peak, max(peak for _, peak in probe.evaluated)
    if low < probe.peak_at_1 < high:
        high = probe.peak_at_1 - 1
    if low >= high:
        raise ValueError(f"{probe.source}: the knob does not move this step's peak ({human_bytes(low)} at every knob "
                         "evaluated): there is no budget between the smallest and the largest peak")
    return low, (low + high) // 2, (low + 3 * high) // 4


def accounting_column(accounting: str | None, preset: bool) -> str:
    """The peak column for ``accounting`` (flat, allocated, reserved or a column name); None: reserved
    bytes for a GPU preset (what the device enforces), allocated bytes otherwise."""
    if accounting is None:
        return "reserved_peak" if preset else "allocated_peak"
    if accounting in ACCOUNTINGS:
        return accounting
    if accounting not in PEAK_ACCOUNTINGS:
        raise ValueError(f"unknown accounting {accounting!r}{did_you_mean(accounting, PEAK_ACCOUNTINGS)}; "
                         f"choose {', '.join(PEAK_ACCOUNTINGS)}")
    return PEAK_ACCOUNTINGS[accounting]


@dataclass(frozen=True)
class BudgetSearch:
    """:func:`search_budget`'s findings: the choice's grid index (None: none fits) and every evaluated row."""

    choice: float | None
    rows: dict
    holes: tuple[tuple[float, float], ...]
    fails_below: float | None


def search_budget(evaluate: Callable[[float], dict], budget: int, accounting: str,
                  grid: list[float], scan_step: float = SCAN_STEP) -> BudgetSearch:
    """The largest grid knob that fits ``budget`` under ``accounting``, and the holes below it (module docstring).

    ``evaluate``: knob -> a row with the accounting's peak (``knob_peaks`` bound to a joint graph, or a
    planted curve in the tests). ``grid`` ascending, ending at 1.0 (with 0.99 in it: the cliff)."""
    rows: dict[float, dict] = {}

    def fits(index: int) -> bool:
        knob = grid[index]
        if knob not in rows:
            rows[knob] = dict(evaluate(knob))
        return rows[knob][accounting] <= budget

    top = len(grid) - 1
    below_top = grid.index(0.99) if 0.99 in grid else top - 1
    fits(below_top)  # the cliff's two sides are always evaluated
    fits(top)
    _scan(fits, grid, top, scan_step)
    index = {knob: i for i, knob in enumerate(grid)}
    fitting = [index[k] for k in rows if rows[k][accounting] <= budget]
    if not fitting:
        return BudgetSearch(None, rows, (), None)
    low = max(fitting)
    high = min((index[k] for k in rows if index[k] > low), default=None)
    while high is not None and high - low > 1:  # bisect the edge above the largest fitting scanned knob
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    _refine_edges(fits, grid, rows, low, budget, accounting)
    holes, fails_below = _below(rows, grid[low], budget, accounting)
    return BudgetSearch(grid[low], rows, holes, fails_below)


def _scan(fits: Callable[[int], bool], grid: list[float], up_to: int, scan_step: float) -> None:
    """Evaluate every ``scan_step`` of the grid from its start up to index ``up_to``."""
    stride = max(1, round(scan_step / (grid[1] - grid[0]))) if len(grid) > 1 else 1
    for index in range(0, up_to, stride):
        fits(index)


def _refine_edges(fits, grid: list[float], rows: dict, choice: int, budget: int, accounting: str) -> None:
    """Bisect, on the grid, every edge between a fitting and a failing evaluated knob below the choice."""
    index = {knob: i for i, knob in enumerate(grid)}
    while True:
        evaluated = sorted(i for i in (index[k] for k in rows) if i <= choice)
        edges = [(a, b) for a, b in zip(evaluated, evaluated[1:])
                 if b - a > 1 and (rows[grid[a]][accounting] <= budget) != (rows[grid[b]][accounting] <= budget)]
        if not edges:
            return
        for a, b in edges:
            fits((a + b) // 2)


def _below(rows: dict, choice: float, budget: int, accounting: str) -> tuple[tuple, float | None]:
    """Failing runs of evaluated knobs below ``choice``: holes (a fitting knob below them) and the bottom run."""
    knobs = sorted(k for k in rows if k <= choice)
    runs, start = [], None
    for i, knob in enumerate(knobs):
        failing = rows[knob][accounting] > budget
        if failing and start is None:
            start = i
        if not failing and start is not None:
            runs.append((start, i - 1))
            start = None
    holes = tuple((knobs[a], knobs[b]) for a, b in runs if a > 0)
    fails_below = knobs[runs[0][1]] if runs and runs[0][0] == 0 else None
    return holes, fails_below


def fit_knob(model, example_inputs=(), loss_fn=None, *, budget, device: str | None = None,
             accounting: str | None = None, backend: str = BACKENDS[0], solver: str | None = None,
             runtime_estimator: str | None = None, cache=True) -> KnobFit:
    """The largest ``activation_memory_budget`` whose predicted peak fits ``budget`` (see the module docstring).

    ``model``: a live ``nn.Module`` (with ``example_inputs``, a tensor or a tuple, and ``loss_fn(output)``
    returning the scalar loss; None sums the outputs) or a ``dtrlab capture`` source string (then
    ``example_inputs`` is a dict of its build options: ``{"batch": 8, "seq": 1024}``). ``device``: a GPU preset
    (:data:`dtrlab.memory.device.GPU_PRESETS`, ``"H100-80GB"``: the step traced for it and lowered by CUDA
    Inductor, no GPU needed), ``"cuda"`` (this machine's GPU's preset, :func:`lowering_for`) or ``"cpu"``
    (default: the model's device; a model on CUDA is fitted for this machine's GPU).
    ``budget``: int bytes, a size
    (``"40GiB"``) or a GPU preset (:data:`dtrlab.memory.device.GPU_PRESETS`). ``cache``: True
    (``$DTRLAB_CACHE``), a directory, or False."""
    budget, preset = budget_bytes(budget)
    column = accounting_column(accounting, preset)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}{did_you_mean(backend, BACKENDS)}; "
                         f"the peak is replayed for {', '.join(BACKENDS)}")
    started = time.perf_counter()
    joint, workload = _trace(model, example_inputs, loss_fn, device, backend)
    return _fit_joint(joint, workload, budget=budget, column=column, backend=backend, solver=solver,
                      runtime_estimator=runtime_estimator, cache=cache, started=started)


def _fit_joint(joint, workload, *, budget: int, column: str, backend: str, solver, runtime_estimator, cache,
               started: float) -> KnobFit:
    from ..trace.torch_compile.joint import joint_hash
    from ..trace.torch_compile.partition import partitioner_config

    key = {"graph": joint_hash(joint), "torch": joint.torch_version,
           **search_settings(budget=budget, column=column, backend=backend, solver=solver,
                             runtime_estimator=runtime_estimator, lowering=joint.gpu or "cpu")}
    path = cache_path(cache, key)
    cached = read_entry(path, key) if path is not None else None
    if cached is not None:
        return dataclasses.replace(from_dict(cached["record"]), seconds=time.perf_counter() - started,
                                   from_cache="graph")
    with partitioner_config(None, runtime_estimator=runtime_estimator):
        search = search_budget(_evaluator(joint, solver), budget, column, KnobPlan().grid(), SCAN_STEP)
        # The chosen partition's graphs run node by node: its recomputed operators by name and their FLOPs
        # (capture's FLOP model; Inductor's fused kernels have no per-operator count, the partition is the same).
        chosen = _partitioned(joint, search.choice, solver) if search.choice is not None else None
    random = _random_operators(joint, chosen) if chosen is not None else ()
    fit = _record(joint, search, random, key, time.perf_counter() - started,
                  chosen.recompute_flops if chosen is not None else None)
    if fit.knob is None:
        fit = dataclasses.replace(fit, instead=_instead_of_knob(workload, budget),
                                  seconds=time.perf_counter() - started)
    if path is not None:
        write_entry(path, {"key": key, "record": fit.to_dict()})
    return fit


def search_settings(*, budget: int, column: str, backend: str, solver, runtime_estimator, lowering: str) -> dict:
    """What decides a pick besides the step: the cache key's other half (the record's format, the rules the step's
    peaks are recorded by, the lowering's target, what a CPU target's measured operator temporaries depend on, and
    the search's grid)."""
    grid = KnobPlan().grid()
    # A CPU target counts convolutions' temporaries as measured on this machine (torch, CPU, threads: an answer
    # found under 16 threads is not one for 2); a GPU target measures none.
    temporaries = op_temporaries.device_key() if lowering == "cpu" else None
    return {"format": FIT_FORMAT, "recording": RECORDING_VERSION, "accounting": column, "backend": backend,
            "lowering": lowering, "temporaries": temporaries, "solver": solver, "runtime_estimator": runtime_estimator,
            "budget": budget, "grid": [grid[0], grid[-1], len(grid)], "scan_step": SCAN_STEP}


def _trace(model, example_inputs, loss_fn, device, backend: str):
    """The joint graph, and what the eager capture needs (a source's options, or the live step). For a GPU (a preset,
    or the one a live model sits on), the step is traced on the CPU and re-traced for the GPU
    (:func:`dtrlab.trace.torch_compile.tracing.trace_step`'s ``gpu``)."""
    from ..trace.torch_compile.tracing import closure_on, fake_module, trace_joint, trace_step

    if isinstance(model, str):
        if not isinstance(example_inputs or {}, dict) or loss_fn is not None:
            raise ValueError("a model source takes its build options as a dict (example_inputs={'batch': 8}) and "
                             "its own loss (loss_fn=None)")
        options = dict(example_inputs or {})
        gpu = _asked_gpu(device, model) if device else None
        lowered = {} if gpu is None else {"gpu": gpu}
        joint = trace_joint(model, device="cpu" if gpu else device or "cpu", backend=backend, **lowered, **options)
        return joint, ("source", model, options)
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    gpu, own = lowering_for(model, device), _own_device(model)
    lowered = {} if gpu == "cpu" else {"gpu": gpu}
    device = "cpu" if lowered else device
    name = type(model).__name__
    if device is None or _same_device(device, own):
        # dynamo fakes the live model and inputs itself (no step runs, nothing is allocated), keeping what they
        # share with the loss (a closure's labels that are the inputs, tied weights) shared, as the real step does.
        joint = trace_step(model, inputs, loss_fn, source=name, backend=backend, **lowered)
    else:  # another device: a fake copy there, and the tensors the loss reads from its closure twinned there too
        with closure_on(loss_fn, device):
            joint = trace_step(*fake_module(model, inputs, device), loss_fn, source=name, backend=backend, **lowered)
    return joint, ("module", model, (inputs, loss_fn))


def _own_device(model):
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module or a dtrlab capture source, got {type(model).__name__}")
    return next((t.device for t in model.parameters()), torch.device("cpu"))


def lowering_for(model, device: str | None) -> str:
    """Whose Inductor lowering answers for a live ``model`` asked about on ``device`` (None: the model's own): a GPU
    preset's; for a CUDA device, this machine's GPU, wherever the model sits
    (:func:`~dtrlab.trace.torch_compile.tracing.gpu_of`: one line asking for a preset where there is no GPU or none
    matches; the engine's device guard would otherwise stop the trace with an internal error); else the CPU's
    ("cpu")."""
    return _asked_gpu(_own_device(model) if device is None else device, type(model).__name__) or "cpu"


def _asked_gpu(device, name: str) -> str | None:
    """The GPU target ``device`` asks for: a preset's name, or this machine's GPU for a CUDA device; else None."""
    from ..trace.torch_compile.tracing import gpu_of

    return gpu_preset(device) or gpu_of(device, name)


def _same_device(device, own) -> bool:
    import torch

    return torch.device(device) == own  # a CUDA device never gets here: it is lowered for a GPU, traced on the CPU


def _evaluator(joint, solver) -> Callable[[float], dict]:
    """knob -> the peaks of the step under the accounting of the backend ``joint`` was traced for."""
    from ..memory.partitioned import knob_peaks

    return lambda knob: knob_peaks(joint, round(knob, KNOB_DECIMALS), solver=solver)


def recomputed_random(joint, knob: float, solver: str | None = None) -> tuple[str, ...]:
    """Forward random operators that torch's partition of ``joint`` at ``knob`` recomputes in the backward,
    by joint-graph name (pytorch#190758: each recompute draws fresh randomness)."""
    return _random_operators(joint, _partitioned(joint, knob, solver))


def _partitioned(joint, knob: float, solver: str | None):
    from ..trace.torch_compile.partition import partition

    return partition(joint, round(knob, KNOB_DECIMALS), solver=solver)


def _random_operators(joint, step) -> tuple[str, ...]:
    nodes = {node.name: node for node in joint.graph_module.graph.nodes}
    return tuple(name for name in dict.fromkeys(step.recomputed) if _is_random(nodes.get(name)))


def _is_random(node) -> bool:
    """A random operator whose randomness matters: torch's partitioner's own test (``is_rng_op``,
    torch/_functorch/partitioners.py:216: the ``nondeterministic_seeded`` tag, except attention with a dropout
    probability of 0, which the tag also marks); the tag alone where this torch lacks it."""
    import torch

    if node is None:
        return False
    try:
        from torch._functorch.partitioners import is_rng_op
    except ImportError:
        return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
    return bool(is_rng_op(node))


def _record(joint, search: BudgetSearch, random: tuple, key: dict, seconds: float, flops: int | None) -> KnobFit:
    column, rows = key["accounting"], search.rows
    knobs = sorted(rows)
    minimum = min(knobs, key=lambda k: (rows[k][column], -k))
    row = rows.get(search.choice)  # None when no knob fits
    any_row = rows[knobs[-1]]
    return KnobFit(
        source=joint.source, budget=key["budget"], accounting=column, backend=key["backend"],
        solver=str(any_row["solver"]), runtime_estimator=str(any_row["runtime_estimator"]),
        knob=search.choice, peak=int(row[column]) if row else None,
        margin=key["budget"] - int(row[column]) if row else None,
        recompute_flops=flops if row else None,
        recompute_runtime=float(row["proxy_recompute_runtime"]) if row else None,
        lowering_is_safe=row is not None and not search.holes and search.fails_below is None,
        holes=search.holes, fails_below=search.fails_below, min_peak_knob=minimum, min_peak=int(rows[minimum][column]),
        peak_at_1=int(rows[1.0][column]), peak_at_099=int(rows[0.99][column]), recomputed_random=random,
        instead=None, evaluated=tuple((k, int(rows[k][column])) for k in knobs), seconds=seconds,
        graph_hash=key["graph"], torch_version=key["torch"], lowering=key["lowering"])


def _instead_of_knob(workload, budget: int) -> dict:
    """DTR and monotone(dtr) at ``budget`` on the same model's eager capture (flat memory: monotone's
    guarantee needs it), or why they could not be run."""
    from ..runtime import simulate
    from ..runtime.semantics import REFERENCE

    try:
        trace = _eager_trace(workload)
    except Exception as exc:  # a step that runs under torch.compile may not run on meta tensors
        return {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
    found = {"memory": "flat", "unbounded_peak": int(trace.meta["peak_live_bytes"])}
    for policy in ("dtr", "monotone"):
        result = simulate(trace, policy, budget_bytes=budget, semantics=REFERENCE)
        found[policy] = {"status": result.status, "overhead": result.overhead if result.passed else None}
    return found


def _eager_trace(workload):
    """The eager step's dtrlab trace (FLOP costs, meta tensors), as ``dtrlab capture`` records it."""
    import torch

    from ..trace.capture import capture, record
    from ..trace.models import meta_patches
    from ..trace.torch_compile.tracing import closure_on, meta_module
    from ..trace.simrd_log import parse_lines

    kind, model, options = workload
    if kind == "source":
        recording = capture(model, cost="flops", **options)
    else:
        inputs, loss_fn = options
        meta_inputs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: torch.empty_like(
            t, device="meta").requires_grad_(t.requires_grad), inputs)
        with torch.device("meta"), meta_patches(), closure_on(loss_fn, "meta"):
            recording = record(meta_module(model), meta_inputs, loss_fn=loss_fn, cost="flops")
    trace = parse_lines((), source="<fit_knob capture>", name=str(recording.meta.get("source", "model")),
                        records=list(enumerate(recording.lines, 1)))
    trace.meta["peak_live_bytes"] = recording.peak_live_bytes
    return trace


def cache_path(cache, key: dict, folder: str = "") -> Path | None:
    """Where the answer under ``key`` is cached (``cache``: True for ``$DTRLAB_CACHE/fit_knob``, a directory, or
    False/None for no cache), in ``folder`` of it."""
    if cache is False or cache is None:
        return None
    if cache is True:
        from ..trace.cache import default_cache_dir

        directory = default_cache_dir() / "fit_knob"
    else:
        directory = Path(cache)
    directory = directory / folder
    directory.mkdir(parents=True, exist_ok=True)
    return directory / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32] + ".json")


def write_entry(path: Path, document: dict, fields: tuple[str, ...] = ("record",)) -> None:
    """``document`` (its ``key`` and ``fields``) written atomically with the sha256 of its ``fields``."""
    atomic_write_json(path, {**document, "sha256": _fields_hash(document, fields)})


def read_entry(path: Path, key: dict, fields: tuple[str, ...] = ("record",)) -> dict | None:
    """The cache entry at ``path`` when it is ``key``'s and its ``fields`` match their sha256 (its ``record`` a
    :class:`KnobFit`'s); None when absent; a damaged one is moved aside (with a warning) and None."""
    if not path.exists():
        return None
    try:
        document = read_json(path)
        if not isinstance(document, dict) or document.get("key") != key or \
                _fields_hash(document, fields) != document.get("sha256"):
            raise IntegrityError(f"{path}: its key or {', '.join(fields)} do not match its sha256")
        from_dict(document["record"])
        return document
    except (IntegrityError, KeyError, TypeError) as exc:
        quarantine(path, str(exc))
        return None


def _fields_hash(document: dict, fields: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps({k: document.get(k) for k in fields}, sort_keys=True).encode()).hexdigest()


def from_dict(record: dict) -> KnobFit:
    """A :class:`KnobFit` from its ``to_dict()``."""
    tuples = {"holes": tuple(tuple(h) for h in record["holes"]),
              "evaluated": tuple(tuple(e) for e in record["evaluated"]),
              "recomputed_random": tuple(record["recomputed_random"])}
    return KnobFit(**{**record, **tuples})


def _instead(instead: dict) -> str:
    if "error" in instead:
        return f"DTR could not be simulated on the eager capture ({instead['error']})"
    parts = [f"{name} {instead[name]['status']}" + (f" at overhead {instead[name]['overhead']:.3f}"
                                                    if instead[name]["overhead"] is not None else "")
             for name in ("dtr", "monotone")]
    return ", ".join(parts) + " at this budget (flat bytes, eager step)"


def _above(knob: float) -> str:
    if knob >= 1.0:
        return "the top of the knob's range"
    return f"the grid knob above it, {round(knob + 0.01, 2):g}, does not fit"


def _estimate_unit(estimator: str) -> str:
    return ESTIMATE_UNITS.get(estimator, f"in {estimator}'s unit")


def _short(column: str) -> str:
    return column.removesuffix("_peak") + " bytes"
