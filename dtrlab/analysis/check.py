"""One question, one answer: *this trace, this device, this budget: is it safe, and what should I pick?*

:func:`check` runs, for each policy asked for (DTR and the zoo's best alternatives by
default) and for two semantics (flat memory, simrd's; and the caching allocator under the
DTR prototype's ``allocated`` semantics on the given device, docs/memory.md):

1. the run at the budget itself;
2. a census in a window of ratios around it with the resolution guarantee of
   docs/sweeps.md (every ``delta`` sampled, every pass/fail edge bisected):
   :func:`~dtrlab.analysis.holes.refine_holes` with ``delta``;
3. the anatomy of every hole in the window (``oom`` / ``cliff`` / ``near-miss`` /
   ``limit``, :func:`~dtrlab.analysis.anatomy.hole_anatomy`) from runs without a limit
   at its failing samples;

and says where the budget lies (passes, inside a hole, below the feasibility threshold),
the nearest *safe* budgets below and above it, and what ``monotone(dtr)`` (hole-free by
construction, dtrlab/calibrated/monotone.py; flat memory only) costs at the budget.

A **safe** budget is a sampled budget that passes with no failing sample within one census
step (``delta`` bytes) on either side: the census finds every hole at least ``delta``
wide, so a hole narrower than that could still lie there (docs/sweeps.md, "The guarantee").
Budgets at the window's ends are judged on the samples inside the window only.

The result is a plain record (:class:`CheckReport`, :meth:`CheckReport.to_dict` for
JSON); :mod:`dtrlab.plots.check` draws it and writes the HTML report.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields

import pandas as pd

from ..calibrated.monotone import Monotone, monotone_envelope
from ..memory.device import device_capacity
from ..policies import get_policy
from ..progress import progress_bar
from ..runtime import ALLOCATED, RESERVED, baseline, budget_for, simulate
from ..runtime.semantics import REFERENCE, Semantics
from ..sweep import sweep
from ..sweep.execution import SERIAL, Execution
from ..trace.model import Trace
from .anatomy import LIMIT_READERS, hole_anatomy, unlimited_runs
from .holes import HoleCensus, census_grid, delta_bytes, refine_holes
from .knob_census import KnobCensus, KnobChoice, gpu_answer, lowering_answer

#: The policies censused by default: DTR and the zoo's policies with the fewest holes at a
#: threshold near DTR's on the shipped censuses (README, docs/sweeps.md: h_DTR^eq and MSPS).
DEFAULT_POLICIES = ("dtr", "dtr_eq_class", "msps")
#: Hole-free by construction; simulated at the budget under flat memory (its calibration needs byte counting).
MONOTONE = "monotone"
#: The accounting the report's knob answers for: allocated bytes under the caching allocator.
KNOB_ACCOUNTING = "allocated_peak"
#: The warnings that say which Inductor lowering a knob census used (printed under the knob's line).
LOWERING_KINDS = ("cpu-lowering", "cuda-lowering")

_RATIO = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(%?)\s*$")


@dataclass(frozen=True)
class CheckPlan:
    """What :func:`check` samples: a ``window`` of ratios (of the unbounded peak) on either side of
    the budget, censused every ``delta`` of the peak with edges bisected to ``resolution`` bytes
    (default: :func:`~dtrlab.analysis.holes.default_resolution`); ``policies`` censused under each
    semantics; ``monotone`` also runs ``monotone(dtr)`` at the budget."""

    window: float = 0.05
    delta: float = 0.002
    policies: tuple[str, ...] = DEFAULT_POLICIES
    monotone: bool = True
    resolution: int | None = None

    def __post_init__(self):
        if not (0 < self.window <= 1 and 0 < self.delta < 1 and self.delta <= self.window):
            raise ValueError(f"check: the window must be in (0, 1] and delta in (0, window] (fractions of the peak), "
                             f"got window={self.window}, delta={self.delta}")
        if not self.policies:
            raise ValueError("check: give at least one policy to census")


@dataclass(frozen=True)
class PolicyCheck:
    """One policy under one semantics (``memory``: ``flat`` or ``caching/allocated(DEVICE)``)."""

    policy: str
    memory: str
    status: str                 # at the budget: pass, oom, thrash
    overhead: float | None      # at the budget, when it passed
    position: str               # safe, pass-near-failure, hole, below-threshold, fails-in-window
    hole: dict | None           # the hole holding the budget, with its anatomy
    holes: list[dict]           # every hole in the window, with its anatomy
    threshold_ratio: float | None
    safe_below: int | None
    safe_above: int | None
    safe_below_overhead: float | None
    safe_above_overhead: float | None
    samples: pd.DataFrame = field(repr=False, compare=False)  # the refined census's samples (for figures)

    def to_dict(self) -> dict:
        record = asdict(self)
        record.pop("samples")
        return record


@dataclass(frozen=True)
class CheckReport:
    """:func:`check`'s answer (see the module docstring)."""

    trace: str
    peak_bytes: int
    device: str
    device_bytes: int
    budget_bytes: int
    ratio: float
    window: tuple[float, float]
    delta_bytes: int
    checks: list[PolicyCheck]
    monotone: dict | None
    knob: dict | None = None  # torch.compile's activation_memory_budget at this budget (KnobChoice's fields)
    knob_choices: list[dict] | None = None  # the choice under each accounting of the census (knob_choices)
    knob_warnings: list[dict] | None = None  # KnobWarning's fields: what the user must know at the choice
    knob_census: KnobCensus | None = field(default=None, repr=False, compare=False)  # for the figure
    #: Activation-checkpointing plans (``--ac``): every plan's row of dtrlab.analysis.checkpointing.plan_table
    #: with ``fits`` (its flat peak within the budget), cheapest first.
    ac: list[dict] | None = None

    def to_dict(self) -> dict:
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("checks", "knob_census")}
        record["window"] = list(self.window)
        record["checks"] = [c.to_dict() for c in self.checks]
        return _plain(record)

    def summary(self) -> list[str]:
        """Five lines: the question, the first policy's answer under each semantics (DTR by default), its
        nearest safe budgets, and monotone(dtr) with the other policies safe at the budget."""
        dtr = self.checks[0]
        caching = next((c for c in self.checks if c.policy == dtr.policy and c.memory != "flat"), None)
        lines = [f"{self.trace}: budget {_gib(self.budget_bytes)} = {self.ratio:.4f} of the {_gib(self.peak_bytes)} "
                 f"peak, device {self.device} ({_gib(self.device_bytes)}"
                 f"{', smaller than the budget' if self.device_bytes < self.budget_bytes else ''})"]
        for item in (dtr, caching):
            if item is not None:
                lines.append(f"{item.policy} @ {item.memory}: {describe_position(item)}")
        if dtr.position == "safe" and (caching is None or caching.position == "safe"):
            lines.append(f"{self.budget_bytes:,} bytes is safe for {dtr.policy} (no failure within one census step, "
                         f"{_gib(self.delta_bytes)})")
        else:
            lines.append(f"nearest safe budgets ({dtr.policy}, flat / caching): below "
                         f"{_safe(dtr.safe_below, self)} / {_safe(caching and caching.safe_below, self)}, above "
                         f"{_safe(dtr.safe_above, self)} / {_safe(caching and caching.safe_above, self)}")
        lines.append(self._alternatives())
        if self.knob is not None:
            lines.append(f"torch.compile activation_memory_budget ({self.knob['accounting']}): "
                         f"{KnobChoice(**self.knob).describe()}")
            lines += [w["message"] for w in self.knob_warnings or () if w["kind"] in LOWERING_KINDS]
        if self.ac is not None:
            lines.append(self._checkpointing())
        return lines

    def _checkpointing(self) -> str:
        """One line: the checkpointing plans whose flat peak fits the budget, cheapest first, or the smallest peak."""
        fitting = [f"{p['plan']} (overhead {p['overhead']:.3f})" for p in self.ac if p["fits"]]
        if fitting:
            return "activation checkpointing (flat peak): fits with " + ", ".join(fitting)
        smallest = min(self.ac, key=lambda p: p["flat_peak"])
        return (f"activation checkpointing (flat peak): no plan fits; the smallest peak is {smallest['plan']}'s, "
                f"{_gib(smallest['flat_peak'])}")

    def _alternatives(self) -> str:
        passing = [f"{c.policy} @ {c.memory} (overhead {c.overhead:.3f})" for c in self.checks
                   if c.position == "safe" and c.policy != self.checks[0].policy]
        parts = []
        if self.monotone is not None:
            m = self.monotone
            parts.append(f"monotone(dtr) {m['status']}" + (f" at overhead {m['overhead']:.3f}" if m["overhead"]
                                                          is not None else "")
                         + (f", passes from {m['threshold_ratio']:.3f} of the peak" if m["threshold_ratio"] else ""))
        others = len({c.policy for c in self.checks}) > 1
        parts.append("other policies safe here: " + (", ".join(passing) if passing else
                                                     "none" if others else "none checked"))
        return "; ".join(parts)


def describe_position(item: PolicyCheck) -> str:
    """One phrase: where the budget lies for ``item``."""
    if item.position in ("safe", "pass-near-failure"):
        near = "" if item.position == "safe" else ", but within one census step of a failure"
        return f"passes (overhead {item.overhead:.3f}){near}"
    if item.position == "hole":
        hole = item.hole
        closes = hole.get("closes_at")
        closing = "fails at any overhead limit" if hole.get("anatomy") == "oom" else \
            (f"closes at overhead limit {closes:.2f}" if closes is not None else "")
        kind = hole.get("anatomy", "hole")
        article = "an" if kind[:1] in "aeiou" else "a"
        return (f"{item.status}, inside {article} {kind} hole, ratios {hole['fail_low_ratio']:.4f}-"
                f"{hole['fail_high_ratio']:.4f} ({hole['width_bytes'] / 2**20:.1f} MiB wide; {closing})")
    if item.position == "below-threshold":
        return f"{item.status}, below the feasibility threshold ({item.threshold_ratio:.4f} of the peak)"
    return f"{item.status}, and nothing passes above it in the window"


def parse_budget(spec, trace: Trace) -> int:
    """A budget in bytes from ``spec``: an int (bytes), a size with a unit (``"40GiB"``, ``"512MB"``),
    or a ratio of the unbounded peak (``"0.17"``, ``"17%"``; simrd's ``int(peak * ratio)``)."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"budget must be positive bytes, got {spec}")
        return spec
    text = str(spec)
    match = _RATIO.match(text)
    if match and (match.group(2) or "." in match.group(1)):
        ratio = float(match.group(1)) / (100 if match.group(2) else 1)
        return budget_for(trace, ratio)
    if match:
        return parse_budget(int(match.group(1)), trace)
    try:
        size = device_capacity(text)  # the same sizes as a device: 40GiB, 512MB
    except ValueError:
        size = None
    if size is None or size.bytes is None or size.multiple is not None:
        raise ValueError(f"budget {text!r}: give bytes (4294967296), a size (40GiB, 512MB) or a ratio of the "
                         "unbounded peak (0.17 or 17%)")
    return size.bytes


def parse_device(spec) -> tuple[str, int]:
    """A device's label and bytes: a preset (:data:`~dtrlab.memory.device.GPU_PRESETS`), bytes or a size."""
    try:
        capacity = device_capacity(spec)
    except ValueError as exc:  # an unknown spec's message lists the presets already
        raise ValueError(f"device {spec!r}: {exc}") from None
    if capacity.bytes is None or capacity.multiple is not None:
        raise ValueError(f"device {spec!r}: give the device's memory (a preset such as A100-80GB, bytes or a size "
                         "such as 80GiB), not a multiple of the budget or unlimited")
    return str(spec), capacity.bytes


def check_semantics(device_bytes: int, flat: Semantics = REFERENCE) -> list[Semantics]:
    """The two semantics of a check: ``flat`` (simrd's) and the caching allocator under the DTR
    prototype's ``allocated`` semantics on a device of ``device_bytes``."""
    return [flat, flat.with_(memory="caching", enforce=ALLOCATED, device_capacity=device_bytes)]


def check(trace: Trace, budget, device, *, plan: CheckPlan = CheckPlan(), semantics: Semantics = REFERENCE,
          execution: Execution = SERIAL, knob: KnobCensus | None = None,
          knob_warnings: tuple[KnobWarning, ...] = (), ac=None) -> CheckReport:
    """Is ``budget`` (see :func:`parse_budget`) safe for ``trace`` on ``device`` (see :func:`parse_device`)?
    ``semantics`` is the flat configuration (its overhead limit applies to both); see the module docstring.
    ``knob``: a census of torch.compile's ``activation_memory_budget`` on the same step
    (:mod:`dtrlab.analysis.knob_census`); the report then adds the largest knob that fits the budget
    (allocated bytes under the caching allocator), the choice under every accounting
    (:func:`knob_choices`) and the census's warnings (:func:`census_knob_warnings`), followed by
    ``knob_warnings``: those only a capture can tell (recomputed random operators), given by the caller.
    ``ac``: the checkpointing plans of the same step (:func:`dtrlab.analysis.checkpointing.plan_table`); the
    report then lists each with whether its flat peak fits the budget."""
    for name in plan.policies:
        # get_policy: a typo is an error now, not after the first census; monotone refuses the caching census.
        if isinstance(get_policy(name), Monotone):
            raise ValueError(f"check: {name} runs under flat memory only, and check censuses each policy under the "
                             "caching allocator too; monotone(dtr) is checked already (--no-monotone drops it)")
    label, device_bytes = parse_device(device)
    budget = parse_budget(budget, trace)
    peak = baseline(trace).peak_memory
    ratio = budget / peak
    low, high = round(max(plan.delta, ratio - plan.window), 6), round(ratio + plan.window, 6)
    steps = [(name, each) for name in plan.policies for each in check_semantics(device_bytes, semantics)]
    checks = []
    with progress_bar(total=len(steps) + plan.monotone, desc=f"check {trace.name}", unit="census",
              disable=not execution.progress) as bar:
        for name, each in steps:
            bar.set_postfix_str(f"{name} @ {memory_name(each, label)}")
            checks.append(_policy_check(trace, name, budget, (low, high), plan, each, execution,
                                        memory_name(each, label)))
            bar.update()
        if plan.monotone:
            bar.set_postfix_str("monotone(dtr)")
            monotone = _monotone(trace, budget, semantics)
            bar.update()
    return CheckReport(trace=trace.name, peak_bytes=peak, device=label, device_bytes=device_bytes,
                       budget_bytes=budget, ratio=ratio, window=(low, high), delta_bytes=delta_bytes(plan.delta, peak),
                       checks=checks, monotone=monotone if plan.monotone else None,
                       ac=None if ac is None else _plans_at(ac, budget), **_knob_fields(knob, budget, knob_warnings))


def _plans_at(plans, budget: int) -> list[dict]:
    """The plans' rows with ``fits`` (flat peak within ``budget``), the least recompute first."""
    rows = plans.sort_values(["recompute_flops", "flat_peak", "plan"]).to_dict("records")
    return [{**row, "fits": row["flat_peak"] <= budget} for row in rows]


def _knob_fields(census: KnobCensus | None, budget: int, extra: tuple[KnobWarning, ...]) -> dict:
    """:class:`CheckReport`'s knob fields at ``budget`` (none without a census)."""
    if census is None:
        if extra:
            raise ValueError("check: knob_warnings need a knob census (knob=...)")
        return {}
    choice = census.knob_for_budget(budget, KNOB_ACCOUNTING)
    warnings = [*census_knob_warnings(census, choice), *extra]
    return {"knob": asdict(choice), "knob_choices": knob_choices(census, budget),
            "knob_warnings": [asdict(w) for w in warnings], "knob_census": census}


def knob_choices(census: KnobCensus, budget: int) -> list[dict]:
    """The census's answer at ``budget`` under each of its accountings: the largest knob that fits, its
    peak, the margin (budget minus that peak), its recompute FLOPs (where the census recorded them), the
    smallest fitting knob, whether lowering is safe and the holes below, and the smallest peak the knob
    reaches at all with the largest knob reaching it."""
    rows = []
    samples = census.samples.set_index("knob")
    for accounting in census.plan.accountings:
        choice = census.knob_for_budget(budget, accounting)
        summary = census.summary.set_index("accounting").loc[accounting]
        knob = choice.largest_fitting_knob
        peak = None if knob is None else int(samples.at[knob, accounting])
        flops = samples.at[knob, "recompute_flops"] if knob is not None and "recompute_flops" in samples else None
        rows.append(_plain({"accounting": accounting, "answers": accounting == KNOB_ACCOUNTING,
                            "largest_fitting_knob": knob, "peak": peak,
                            "margin": None if peak is None else int(budget) - peak, "recompute_flops": flops,
                            "smallest_fitting_knob": choice.smallest_fitting_knob,
                            "lowering_is_safe": choice.lowering_is_safe, "holes": [list(h) for h in choice.holes],
                            "min_peak": int(summary["min_peak"]), "knob_at_min": summary["largest_knob_at_min"]}))
    return rows


@dataclass(frozen=True)
class KnobWarning:
    """One thing the user must know at the chosen knob. ``kind``: ``lowering-unsafe`` (a smaller knob does
    not fit, in a hole or below the smallest fitting knob), ``cliff`` (the choice sits on either side of the
    1.0-to-below-1.0 step), ``below-reachable`` (no knob fits), ``cpu-lowering`` (an Inductor census lowered for
    the CPU answers for the GPU: :func:`~dtrlab.analysis.knob_census.gpu_answer`), ``cuda-lowering`` (one lowered
    for a GPU preset, on fake tensors: :data:`~dtrlab.analysis.knob_census.CUDA_INDUCTOR_ANSWER`), or a kind the caller adds
    (dtrlab.fit_knob: recomputed random operators)."""

    kind: str
    message: str


def census_knob_warnings(census: KnobCensus, choice: KnobChoice) -> list[KnobWarning]:
    """What the census alone can tell about ``choice`` (see :class:`KnobWarning`)."""
    knobs, peaks = census.curve(choice.accounting)
    knob = choice.largest_fitting_knob
    if knob is None:
        summary = census.summary.set_index("accounting").loc[choice.accounting]
        return [KnobWarning("below-reachable", f"no knob value fits {choice.budget:,} bytes ({choice.accounting}): "
                            f"the smallest peak the knob reaches is {int(summary['min_peak']):,} bytes, at knob "
                            f"{summary['largest_knob_at_min']:g}; see DTR's and monotone(dtr)'s outcome at this "
                            "budget above"), *_lowering(census)]
    warnings = []
    if not choice.lowering_is_safe:
        warnings.append(KnobWarning("lowering-unsafe", f"{choice.describe()} at {choice.budget:,} bytes "
                                    f"({choice.accounting})"))
    cliff = _cliff(knobs, peaks, knob)
    if cliff is not None:
        warnings.append(cliff)
    return warnings + _lowering(census)


def _lowering(census: KnobCensus) -> list[KnobWarning]:
    """Which lowering an Inductor census used: ``cpu-lowering`` (the CPU's answers for a GPU as the best available)
    or ``cuda-lowering`` (CUDA Inductor's for a GPU preset, not yet measured on a GPU); none for aot_eager."""
    answer = lowering_answer(census.meta)
    if answer is None:
        return []
    return [KnobWarning("cpu-lowering" if gpu_answer(census.meta) else "cuda-lowering", answer)]


def _cliff(knobs: list[float], peaks: list[int], knob: float) -> KnobWarning | None:
    """The 1.0-against-below-1.0 warning when ``knob`` is 1.0 or the largest evaluated knob below it and
    the two peaks differ. At exactly 1.0 torch's partitioner returns its default min-cut
    (torch/_functorch/partitioners.py:3480, torch 2.14); below 1.0 it may take a more aggressive cut before
    any knapsack (:3510), so the step between 1.0 and 0.99 is a change of regime, not of degree."""
    peak_of = dict(zip(knobs, peaks))
    below = max((k for k in knobs if k < 1.0), default=None)
    if 1.0 not in peak_of or below is None or peak_of[1.0] == peak_of[below] or knob not in (1.0, below):
        return None
    change = peak_of[below] / peak_of[1.0] - 1
    if knob == 1.0:
        return KnobWarning("cliff", f"the chosen knob 1.0 is torch's default, where the partitioner keeps its "
                           f"default min-cut; at {below:g} it may cut differently and the peak changes by "
                           f"{change:+.1%} ({peak_of[below] - peak_of[1.0]:+,} bytes): the step from 1.0 to "
                           f"{below:g} is a change of regime")
    return KnobWarning("cliff", f"the chosen knob {below:g} sits just below the 1.0 cliff: 1.0 (torch's default) "
                       f"peaks at {peak_of[1.0]:,} bytes and does not fit; {below:g} fits because below 1.0 the "
                       f"partitioner cuts differently ({change:+.1%})")


def memory_name(semantics: Semantics, device: str) -> str:
    """``flat``, or e.g. ``caching/allocated(A100-80GB)``: the anatomy tables' label, naming the ``device``."""
    if semantics.enforce == RESERVED:
        return str(semantics.memory)
    return f"{semantics.memory}/{semantics.enforce}({device})"


def _policy_check(trace: Trace, policy: str, budget: int, window: tuple[float, float], plan: CheckPlan,
                  semantics: Semantics, execution: Execution, memory: str) -> PolicyCheck:
    """The census of ``policy`` in ``window`` with ``budget`` among its samples, its holes' anatomy and
    the budget's place in it."""
    grid = census_grid(trace, f"{window[0]!r}:{window[1]!r}", plan.delta)
    quiet = execution.with_(progress=False)  # the grid shows its bar; the few runs after it do not
    frame = pd.concat([sweep(trace, policy, **grid, semantics=semantics, execution=execution),
                       sweep(trace, policy, budgets=[budget], semantics=semantics, execution=quiet)],
                      ignore_index=True)
    census = refine_holes(trace, frame, policy, delta=plan.delta, resolution=plan.resolution, execution=quiet).refined
    holes = census.holes
    if get_policy(policy).name not in LIMIT_READERS and len(holes):
        holes = hole_anatomy(census, unlimited_runs(trace, census, execution=quiet))
    hole_records = [_plain(h) for h in holes.to_dict("records")]
    samples = census.samples
    at = samples[samples["budget_bytes"] == budget].iloc[0]
    margin = delta_bytes(plan.delta, baseline(trace).peak_memory)
    safe = _safe_budgets(samples, margin)
    below = [b for b in safe if b <= budget]
    above = [b for b in safe if b >= budget]
    overhead = dict(zip(samples["budget_bytes"], samples["overhead"]))
    hole = next((h for h in hole_records if h["fail_low_bytes"] <= budget <= h["fail_high_bytes"]), None)
    safe_below, safe_above = (below[-1] if below else None), (above[0] if above else None)
    return PolicyCheck(
        policy=census.policy, memory=memory, status=str(at["status"]),
        overhead=float(at["overhead"]) if at["status"] == "pass" else None,
        position=_position(census, budget, at["status"] == "pass", hole, budget in safe),
        hole=hole, holes=hole_records, threshold_ratio=census.threshold_ratio, safe_below=safe_below,
        safe_above=safe_above, safe_below_overhead=_float(overhead.get(safe_below)),
        safe_above_overhead=_float(overhead.get(safe_above)), samples=samples)


def _safe_budgets(samples: pd.DataFrame, margin: int) -> list[int]:
    """Passing sampled budgets with no failing sample within ``margin`` bytes, ascending."""
    budgets = samples["budget_bytes"].to_numpy()
    failing = budgets[(samples["status"] != "pass").to_numpy()]
    passing = budgets[(samples["status"] == "pass").to_numpy()]
    return sorted(int(b) for b in passing if not ((failing >= b - margin) & (failing <= b + margin)).any())


def _position(census: HoleCensus, budget: int, passed: bool, hole: dict | None, safe: bool) -> str:
    if passed:
        return "safe" if safe else "pass-near-failure"
    if hole is not None:
        return "hole"
    if census.threshold_bytes is not None and budget < census.threshold_bytes and \
            not (census.samples.loc[census.samples["budget_bytes"] < budget, "status"] == "pass").any():
        return "below-threshold"
    return "fails-in-window"


def _monotone(trace: Trace, budget: int, semantics: Semantics) -> dict:
    """``monotone(dtr)`` at ``budget`` under flat memory: its status, overhead and the smallest ratio it passes at."""
    flat = REFERENCE.with_(overhead_limit=semantics.overhead_limit)
    result = simulate(trace, MONOTONE, budget_bytes=budget, semantics=flat)
    envelope = monotone_envelope(trace, semantics=flat)
    passing = envelope[envelope["base_status"] == "pass"]
    return {"policy": result.policy, "memory": "flat", "status": result.status,
            "overhead": result.overhead if result.passed else None,
            "threshold_ratio": float(passing["ratio"].iloc[0]) if len(passing) else None}


def _float(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _plain(value):
    """``value`` with numpy scalars as Python numbers and non-finite floats as None (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def _safe(budget: int | None, report: CheckReport) -> str:
    return "none in the window" if budget is None else f"{_gib(budget)} ({budget / report.peak_bytes:.4f})"
