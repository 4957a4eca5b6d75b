"""``monotone``: a policy wrapper whose feasibility is monotone in the budget, by construction.

Training repeats the same step, so a runtime can afford *calibration*: run the base
policy once at each of a few budgets ``c_1 < ... < c_k`` (the ``calibration`` ratios)
and remember which passed and at what compute. At a budget ``B`` the wrapper then

1. picks the **cap** ``B* = argmin { clock(c_i) : c_i <= B, c_i passed }`` (ties: the
   larger budget), the cheapest passing calibration budget that fits in ``B``;
2. runs the base policy with the eviction trigger at ``B*`` instead of ``B``: the
   runtime evicts whenever an allocation would exceed ``B*``. It never holds more than
   ``B* <= B`` bytes, so it is a valid run at ``B``, and it is the calibration run at
   ``B*`` replayed decision for decision (the simulator is deterministic);
3. refuses (an immediate ``oom``) when no calibration budget ``<= B`` passed.

Feasibility at ``B`` is ``[B >= c_first]`` (the smallest passing calibration budget),
a step function of ``B``, so there is no hole at any budget, sampled or not; the
overhead at ``B`` is the prefix minimum of the calibration overheads, so it never
increases with ``B``. The proof and the costs are in docs/policies.md.

The cap is applied in :meth:`Monotone.start` by lowering the simulator's ``budget``,
the one runtime attribute this policy writes; eviction choices are the base policy's.
Calibration runs are memoized per process (a sweep worker calibrates a trace once) and read
from the sweep cache when it holds them. Because it simulates to decide, this module lives
above the runtime and the sweep (:mod:`dtrlab.calibrated`); it registers ``monotone`` in the
policy registry when imported, which ``import dtrlab`` does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ..policies.base import Policy, get_policy, register
from ..runtime import REFERENCE, Semantics, Simulator, baseline, budget_for, simulate

DEFAULT_CALIBRATION = "0.05:1.0:0.01"


@dataclass(frozen=True)
class CalibrationPoint:
    """One calibration run of the base policy."""

    ratio: float
    budget_bytes: int
    status: str
    clock: int

    @property
    def passed(self) -> bool:
        return self.status == "pass"


# (trace hash, base label, base class, budgets, remat limit) -> calibration points
_CALIBRATIONS: dict[tuple, tuple[CalibrationPoint, ...]] = {}


def calibration_ratios(calibration) -> list[float]:
    """The calibration ratios from ``"start:stop:step"`` or a list of ratios."""
    from ..sweep import parse_ratios  # on use: `import dtrlab` registers monotone without importing pandas

    return sorted(set(parse_ratios(calibration)))


def calibrate(trace, base: Policy, calibration, remat_limit: float) -> tuple[CalibrationPoint, ...]:
    """Run ``base`` at every calibration budget of ``trace`` (memoized per process).

    Budgets already in the default sweep cache (or the shipped results) are read from
    it when ``remat_limit`` is exactly that of an overhead limit; the rest are
    simulated here. The cache is only read: sweep workers calibrate concurrently.
    """
    ratios = calibration_ratios(calibration)
    budgets = [budget_for(trace, r) for r in ratios]
    key = (trace.content_hash, base.label, f"{type(base).__module__}.{type(base).__qualname__}", tuple(budgets),
           remat_limit)
    if key not in _CALIBRATIONS:
        overhead_limit = _overhead_limit(trace, remat_limit)
        cached = _cached_runs(trace, base, overhead_limit) if overhead_limit else {}
        points = []
        for ratio, budget in zip(ratios, budgets):
            if budget in cached:
                status, clock = cached[budget]
            elif overhead_limit:  # simulate() takes the compiled core when it can
                result = simulate(trace, copy.deepcopy(base), budget_bytes=budget,
                                  semantics=Semantics(overhead_limit=overhead_limit))
                status, clock = result.status, result.clock
            else:
                sim = Simulator(trace, copy.deepcopy(base), budget, remat_limit)
                status, clock = sim.run(), sim.clock
            points.append(CalibrationPoint(ratio, budget, status, int(clock)))
        _CALIBRATIONS[key] = tuple(points)
    return _CALIBRATIONS[key]


def _overhead_limit(trace, remat_limit: float) -> float | None:
    """The overhead limit whose thrash allowance is exactly ``remat_limit``, if there is one."""
    model_compute = baseline(trace).model_compute
    overhead_limit = 1 + remat_limit / model_compute if model_compute else None
    if overhead_limit is None or model_compute * (overhead_limit - 1) != remat_limit:
        return None
    return overhead_limit


def _cached_runs(trace, base: Policy, overhead_limit: float) -> dict[int, tuple[str, int]]:
    """budget -> (status, clock) of ``base``'s runs in the default sweep cache, if any."""
    from ..sweep import SweepCache, default_cache_dir  # on use, as in calibration_ratios

    try:
        frame = SweepCache(default_cache_dir(), trace, base, Semantics(overhead_limit=overhead_limit)).load()
    except OSError:  # another process compacting the same entry; simulate instead
        return {}
    if frame.empty:
        return {}
    return {int(b): (s, int(c)) for b, s, c in zip(frame["budget_bytes"], frame["status"], frame["clock"])}


def choose_cap(points, budget: int) -> CalibrationPoint | None:
    """The passing calibration point ``<= budget`` with the lowest clock (ties: the larger budget)."""
    fitting = [p for p in points if p.passed and p.budget_bytes <= budget]
    return min(fitting, key=lambda p: (p.clock, -p.budget_bytes)) if fitting else None


@register
class Monotone(Policy):
    """Run ``base`` capped at the cheapest passing calibration budget <= B: feasibility monotone in B."""

    name = "monotone"
    # Its cached and shipped rows were keyed when it lived in dtrlab.policies; same decisions, same key.
    cache_class = "dtrlab.policies.monotone.Monotone"

    @classmethod
    def parameters(cls):
        return {"base": "dtr", "calibration": DEFAULT_CALIBRATION}

    def __init__(self, **params):
        super().__init__(**params)
        if isinstance(self.params["calibration"], (list, tuple)):
            self.params["calibration"] = [float(r) for r in self.params["calibration"]]
        calibration_ratios(self.params["calibration"])  # a clear error now, not in a worker
        self.base = get_policy(self.params["base"])
        if isinstance(self.base, Monotone):
            raise ValueError("monotone(base=monotone(...)) is the same as its inner monotone; wrap a plain policy")
        self.features = frozenset(self.base.features)
        self.cap: CalibrationPoint | None = None

    def start(self, sim):
        if getattr(sim, "memory_model", None) is not None:
            # Under an address-aware model the model's capacity stays B while the cap
            # lowers only the byte count: not the calibration run, so no guarantee.
            raise ValueError("monotone needs the flat byte-counting memory model (the default); "
                             "its replay argument does not hold under an address-aware model")
        points = calibrate(sim.trace, self.base, self.params["calibration"], sim.remat_limit)
        self.cap = choose_cap(points, sim.budget)
        # No passing calibration budget fits: refuse with an immediate oom (budget 0)
        # rather than run the base policy at B, whose feasibility is not monotone.
        sim.budget = self.cap.budget_bytes if self.cap else 0
        self.base.start(sim)

    def choose(self, sim, candidates):
        return self.base.choose(sim, candidates)

    def label_params(self):
        shown = {"base": self.params["base"] if isinstance(self.params["base"], str) else self.base.label,
                 "calibration": self.params["calibration"]}
        return {k: v for k, v in shown.items() if v != self.parameters()[k]}

    def __getstate__(self):
        return self.params

    def __setstate__(self, params):
        self.__init__(**params)


def monotone_envelope(trace, base="dtr", calibration=DEFAULT_CALIBRATION, semantics: Semantics = REFERENCE):
    """The calibration table of ``monotone(base)`` on ``trace`` at ``semantics``' overhead limit (flat
    memory, as calibration runs): per calibration budget, the base's status and overhead, and the cap
    the wrapper uses from that budget up to the next one (``cap_ratio``, ``monotone_overhead``; NaN
    below the first passing budget)."""
    import pandas as pd

    semantics.require_default(("memory", "memory_options", "enforce", "device_capacity"),
                              "calibration runs under flat memory, so the envelope")
    base = get_policy(base)
    remat_limit = baseline(trace).model_compute * (semantics.overhead_limit - 1)
    points = calibrate(trace, base, calibration, remat_limit)
    compute = baseline(trace).model_compute
    rows = []
    for p in points:
        cap = choose_cap(points, p.budget_bytes)
        rows.append({"ratio": p.ratio, "budget_bytes": p.budget_bytes, "base_status": p.status,
                     "base_overhead": p.clock / compute if p.passed else float("nan"),
                     "cap_ratio": cap.ratio if cap else float("nan"),
                     "monotone_overhead": cap.clock / compute if cap else float("nan")})
    return pd.DataFrame(rows)
