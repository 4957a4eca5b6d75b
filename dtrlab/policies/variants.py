"""Score variants of h_DTR: the "simple score changes".

All are members of one parametric family,

    h = cost^a / (size^b x (staleness + stale_offset)^c),   cost in {e*, eq-class, local},

scored with ``inf`` when the denominator is not positive (as simrd). Two further
switches change how, not what, is compared:

* ``arithmetic``: ``"exact"`` divides Python integers (one correctly rounded
  division, as simrd); ``"float64"`` converts every factor to float first, so the
  products round. Non-integer exponents need ``"float64"``.
* ``tie_break``: ``"order"`` is simrd's rule (last minimal candidate in pool order,
  stop at a score of 0); ``"storage_id"`` takes the minimal score and breaks ties
  by the smallest storage id, independent of the pool order.

With the defaults (e*, a = b = c = 1, offset 0, exact, order) the family is h_DTR,
decision for decision. The named variants below fix a few parameters each.
"""

from __future__ import annotations

import math

from .ablations import COSTS, cost_function, cost_key
from .base import NotCompiled, ScorePolicy, register
from .core_spec import POLICY_METHODS, Formula, runs_own

ARITHMETIC = ("exact", "float64")
TIE_BREAKS = ("order", "storage_id")


@register(aliases=["h_family"])
class ScoreFamily(ScorePolicy):
    """h = cost^a / (size^b x (staleness + stale_offset)^c), with a choice of arithmetic and tie-breaking."""

    name = "score_family"
    # The runtime maintains what the chosen cost needs; see ``features`` below.
    features = frozenset()

    @classmethod
    def parameters(cls):
        return {"cost": "estar", "a": 1, "b": 1, "c": 1, "stale_offset": 0, "tie_break": "order",
                "arithmetic": "exact"}

    def __init__(self, **params):
        super().__init__(**params)
        p = self.params
        p["cost"] = cost_key(p["cost"])
        if p["cost"] == "nocost":
            raise ValueError("score_family needs a cost (estar, eqclass or local); "
                             "the no-cost scores are the ablation:nocost-* policies")
        if p["arithmetic"] not in ARITHMETIC:
            raise ValueError(f"arithmetic must be one of {ARITHMETIC}, got {p['arithmetic']!r}")
        if p["tie_break"] not in TIE_BREAKS:
            raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {p['tie_break']!r}")
        exponents = {k: p[k] for k in ("a", "b", "c")}
        if p["arithmetic"] == "exact" and not all(isinstance(v, int) and v >= 0 for v in exponents.values()):
            raise ValueError(f"exact arithmetic needs non-negative integer exponents, got {exponents}; "
                             "pass arithmetic='float64' for other exponents")
        feature = COSTS[p["cost"]][0]
        self.features = frozenset({feature} if feature else ())
        floating = p["arithmetic"] == "float64"
        self.score_of = _score_function(cost_function(p["cost"]), p["a"], p["b"], p["c"], p["stale_offset"], floating)
        # What the compiled core computes instead: the closure's own values, not self.params, which
        # may be edited later (the label follows; the score does not).
        self._core_score = self.score_of
        self._core_formula = Formula(p["cost"], floating=floating, a=p["a"], b=p["b"], c=p["c"],
                                     stale_offset=p["stale_offset"])

    def choose(self, sim, candidates):
        if self.params["tie_break"] == "order":
            return super().choose(sim, candidates)
        score_of = self.score_of
        return [min(candidates, key=lambda s: (score_of(sim, s), s))]

    def label_params(self):
        defaults = type(self).parameters()
        return {k: v for k, v in self.params.items() if v != defaults[k]}

    def core_spec(self, build):
        runs_own(self, ScoreFamily, POLICY_METHODS, set_by_init=("score_of",))
        if vars(self).get("score_of") is not self._core_score:
            raise NotCompiled("has a score function the compiled core does not implement")
        build.require(COSTS[self._core_formula.cost][0])
        # choose() reads the parameter at every call: anything but "order" takes min by (score, id).
        return self._core_formula.spec(tie_by_id=self.params.get("tie_break") != "order")

    # The score function is a closure; rebuild it from the parameters when unpickled
    # (process pools send policies to workers).
    def __getstate__(self):
        return self.params

    def __setstate__(self, params):
        self.__init__(**params)


def _score_function(numerator, a, b, c, stale_offset, floating):
    """``score_of(sim, s)`` for one member of the family."""
    if floating:
        def score_of(sim, s):
            denominator = float(sim.size[s]) ** b * float(sim.clock - sim.last_access[s] + stale_offset) ** c
            return float(numerator(sim, s)) ** a / denominator if denominator > 0 else math.inf
    elif (a, b, c) == (1, 1, 1):  # the common case, without the power calls
        def score_of(sim, s):
            denominator = sim.size[s] * (sim.clock - sim.last_access[s] + stale_offset)
            return numerator(sim, s) / denominator if denominator > 0 else math.inf
    else:
        def score_of(sim, s):
            denominator = sim.size[s] ** b * (sim.clock - sim.last_access[s] + stale_offset) ** c
            return numerator(sim, s) ** a / denominator if denominator > 0 else math.inf
    return score_of


def _variant(class_name: str, name: str, doc: str, **fixed) -> type[ScoreFamily]:
    """A registered member of the family: ``fixed`` become its defaults (still overridable)."""
    defaults = {**ScoreFamily.parameters(), **fixed}
    cls = type(class_name, (ScoreFamily,), {
        "name": name, "description": doc, "__doc__": doc, "__module__": __name__,
        "parameters": classmethod(lambda cls: dict(defaults)),
    })
    return register(cls)


# One line each; docs/policies.md has the same table.
DTRFloat64 = _variant("DTRFloat64", "dtr_float64",
                      "h_DTR with every factor in float64: float(cost) / (float(size) * float(staleness)).",
                      arithmetic="float64")
DTRStalePlus1 = _variant("DTRStalePlus1", "dtr_stale_plus1",
                         "h_DTR with staleness smoothed by +1: cost / (size x (staleness + 1)).", stale_offset=1)
DTRTieBreakId = _variant("DTRTieBreakId", "dtr_tiebreak_id",
                         "h_DTR, ties broken by the smallest storage id instead of the pool order.",
                         tie_break="storage_id")
DTRCostSquared = _variant("DTRCostSquared", "dtr_cost_squared",
                          "cost^2 / (size x staleness): recompute cost weighs more.", a=2)
DTRSizeSquared = _variant("DTRSizeSquared", "dtr_size_squared", "cost / (size^2 x staleness): size weighs more.", b=2)
DTRStaleSquared = _variant("DTRStaleSquared", "dtr_stale_squared",
                           "cost / (size x staleness^2): staleness weighs more.", c=2)
DTRSqrtSize = _variant("DTRSqrtSize", "dtr_sqrt_size", "cost / (size^0.5 x staleness) in float64: size weighs less.",
                       b=0.5, arithmetic="float64")
DTREqClassFloat64 = _variant("DTREqClassFloat64", "dtr_eq_class_float64",
                             "h_DTR^eq (equivalence-class cost) in float64.", cost="eqclass", arithmetic="float64")
DTRLocalFloat64 = _variant("DTRLocalFloat64", "dtr_local_float64", "h_DTR^local (own cost only) in float64.",
                           cost="local", arithmetic="float64")

VARIANTS = {cls.name: cls for cls in [DTRFloat64, DTRStalePlus1, DTRTieBreakId, DTRCostSquared, DTRSizeSquared,
                                      DTRStaleSquared, DTRSqrtSize, DTREqClassFloat64, DTRLocalFloat64]}
