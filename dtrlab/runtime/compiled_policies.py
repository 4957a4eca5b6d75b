"""Which policies the compiled core runs, and their encoding for it (the spec tuple).

:func:`policy_spec` turns a policy instance into the tuple that ``_core.replay`` decodes
(``_policy_spec.h``); :func:`policy_reason` says why a policy stays on the Python
simulator. The core runs

* simrd's seven built-ins (:data:`POLICY_CODES`);
* every score formula of :mod:`dtrlab.policies`: the score family with all its
  parameters (the nine variants), ``score_search`` and the searched policies, the
  16 ablations;
* ``twophase`` whose two phases are any of those;
* the address-aware ``coop`` and ``dtr_fit`` (under a memory model that knows addresses).

A policy is recognized by the code it would run, not by its name: the score function
it calls (a built-in's method, or the closure that ``ScoreFamily``, ``ScoreSearch`` or
an ablation built, with the parameters read back from that closure), its ``choose``
and its ``start``. A subclass or an instance that overrides ``score``, ``score_of``,
``choose`` or ``start`` runs something else and stays on the Python simulator, as does
a :func:`~dtrlab.policies.score_policy` function. A spec is built afresh for every run:
it carries the run's own seeded random generator.
"""

from __future__ import annotations

import random

from ..policies.ablations import COSTS, cost_function, cost_key
from ..policies.ablations import _score_function as _ablation_score_function
from ..policies.base import Policy, ScorePolicy
from ..policies.builtin import DTR, LRU, MSPS, DTREqClass, DTRLocal, LargestStorage, RandomStorage
from ..policies.coop import AddressAware, Coop, DTRFit
from ..policies.searched import ScoreSearch
from ..policies.twophase import TwoPhase
from ..policies.variants import ScoreFamily
from ..policies.variants import _score_function as _family_score_function

#: simrd's built-in policy classes, mapped to the core's codes (``_policy_spec.h``).
POLICY_CODES = {DTR: 0, DTREqClass: 1, DTRLocal: 2, MSPS: 3, LRU: 4, LargestStorage: 5, RandomStorage: 6}
_FORMULA, _TWOPHASE, _COOP, _DTR_FIT = 7, 8, 9, 10
_COST_CODES = {"estar": 0, "eqclass": 1, "local": 2, "nocost": 3}

# The functions the core knows, by identity (class methods) or by code (closures).
_BUILTIN_SCORES = {cls.score_of: code for cls, code in POLICY_CODES.items() if cls is not RandomStorage}
_NUMERATORS = {cost_function(cost).__code__: cost for cost in COSTS}
_FAMILY_CODES = {  # the three branches of variants._score_function
    _family_score_function(None, 1, 1, 1, 0, False).__code__: "exact_unit",
    _family_score_function(None, 2, 1, 1, 0, False).__code__: "exact",
    _family_score_function(None, 1, 1, 1, 0, True).__code__: "float64",
}
_ABLATION_CODES = {_ablation_score_function("local", size, stale).__code__: (size, stale)
                   for size in (True, False) for stale in (True, False)}
_SEARCH_CODE = ScoreSearch(d=1).score_of.__code__
_CHOOSERS = {ScorePolicy.choose: "order", ScoreFamily.choose: "params"}
_OVERRIDABLE = ("score", "score_of", "choose", "start")


class _Refused(Exception):
    """Why a policy is not compiled (the message)."""


def policy_reason(policy) -> str | None:
    """Why the core cannot run ``policy``, or None when it can."""
    try:
        _encode(policy, policy, {})
    except _Refused as refused:
        return f"policy {_label(policy)!r} {refused}"
    return None


def policy_spec(policy) -> tuple | None:
    """The core's spec tuple for ``policy``, or None when :func:`policy_reason` refuses it."""
    try:
        return _encode(policy, policy, {})
    except _Refused:
        return None


def _label(policy) -> str:
    try:
        return policy.label
    except Exception:  # a broken user policy still gets its reason
        return type(policy).__name__


def _encode(policy, top, generators: dict) -> tuple:
    """The spec of ``policy``; ``top`` is the policy whose features the runtime maintains."""
    if not isinstance(policy, Policy):
        raise _Refused("is not a dtrlab Policy")
    overridden = set(_OVERRIDABLE) & set(vars(policy))
    cls = type(policy)
    if cls.start is TwoPhase.start and cls.choose is TwoPhase.choose and not overridden and policy is top:
        phases = (getattr(policy, "phase1", None), getattr(policy, "phase2", None))
        return (_TWOPHASE, *(_encode_phase(phase, top, generators) for phase in phases))
    if cls.start is RandomStorage.start and cls.choose is RandomStorage.choose and not overridden:
        seed = policy.params.get("seed")
        if type(seed) is not int:
            raise _Refused(f"has seed {seed!r}, not an int")
        # The random policy's own generator, seeded as its start() does: the same draws in the same
        # order. One instance serving both phases of a twophase is re-seeded by each start(): one generator.
        if id(policy) not in generators:
            generators[id(policy)] = random.Random(seed).randrange
        return (POLICY_CODES[RandomStorage], generators[id(policy)])
    if isinstance(policy, AddressAware):
        return _encode_address_aware(policy, top, overridden)
    if not isinstance(policy, ScorePolicy):
        raise _Refused("is a chooser policy the compiled core does not implement")
    if overridden - {"score_of"}:
        raise _Refused(f"has {', '.join(sorted(overridden - {'score_of'}))} overridden on the instance")
    if cls.score is not ScorePolicy.score or cls.start is not Policy.start or cls.choose not in _CHOOSERS:
        raise _Refused("defines its own score, choose or start")
    if not (cls.score_of is ScorePolicy.score_of or cls.score_of in _BUILTIN_SCORES
            or getattr(cls.score_of, "__code__", None) in _ABLATION_CODES):
        raise _Refused("defines its own score_of")  # even where an instance's closure shadows it
    score_of = vars(policy).get("score_of", cls.score_of)
    if score_of in _BUILTIN_SCORES and "score_of" not in vars(policy):
        code = _BUILTIN_SCORES[score_of]
        _check_features(top, {0: "e_star", 1: "eq_class", 3: "e_star"}.get(code))
        if _CHOOSERS[cls.choose] == "params" and _tie_by_id(policy):
            raise _Refused("breaks ties by storage id around a built-in score")
        return (code, None)
    formula = _formula(score_of)
    _check_features(top, COSTS[formula["cost"]][0])
    tie_by_id = _CHOOSERS[cls.choose] == "params" and _tie_by_id(policy)
    if tie_by_id and not (formula["use_size"] or formula["use_stale"]):
        raise _Refused("breaks ties by storage id around an integer score")
    return (_FORMULA, None, _COST_CODES[formula["cost"]], formula["use_size"], formula["use_stale"],
            formula["floating"], tie_by_id, formula["a"], formula["b"], formula["c"], formula["stale_offset"],
            formula["d"])


def _encode_phase(phase, top, generators):
    if isinstance(phase, Policy) and type(phase).choose is TwoPhase.choose:
        raise _Refused("nests a twophase inside a twophase")
    if isinstance(phase, AddressAware):
        raise _Refused("has an address-aware phase (the runtime places first only for the policy itself)")
    return _encode(phase, top, generators)


def _encode_address_aware(policy, top, overridden: set) -> tuple:
    """coop (with its cost) or dtr_fit, exactly these methods."""
    cls = type(policy)
    if policy is not top:
        raise _Refused("is address-aware inside another policy")
    if overridden or {"cost_of", "_block_cost"} & set(vars(policy)):
        raise _Refused("has methods overridden on the instance")
    if cls.choose is DTRFit.choose and cls.start is AddressAware.start:
        _check_features(top, "e_star")
        return (_DTR_FIT, None)
    if (cls.choose is Coop.choose and cls.start is Coop.start and cls.cost_of is Coop.cost_of
            and cls._block_cost is Coop._block_cost):
        try:
            cost = cost_key(policy.params.get("cost"))  # what start() reads
        except (AttributeError, ValueError):
            cost = None
        if cost not in ("estar", "eqclass", "local"):
            raise _Refused(f"has cost {policy.params.get('cost')!r}, not a recompute cost")
        _check_features(top, COSTS[cost][0])
        return (_COOP, None, _COST_CODES[cost])
    raise _Refused("is an address-aware policy the compiled core does not implement")


def _tie_by_id(policy) -> bool:
    # ScoreFamily.choose reads the parameter at every call: anything but "order" takes min by (score, id).
    return policy.params.get("tie_break") != "order"


def _check_features(top, feature: str | None) -> None:
    # The reference maintains only the features the policy declares (and fails without them).
    if feature is not None and feature not in frozenset(getattr(top, "features", ())):
        raise _Refused(f"reads {feature} without declaring it in its features")


def _closure(function) -> dict:
    return dict(zip(function.__code__.co_freevars, (cell.cell_contents for cell in function.__closure__ or ())))


def _formula(score_of) -> dict:
    """The formula a score function computes, read from its code and closure."""
    function = getattr(score_of, "__func__", score_of)
    code = getattr(function, "__code__", None)
    d = 0
    if code is _SEARCH_CODE:  # family_score(sim, s) * (1 + n) ** d
        variables = _closure(function)
        d = _number(variables["d"], "d", integer_only=False)
        function = variables["family_score"]
        code = getattr(function, "__code__", None)
    if code in _ABLATION_CODES:
        use_size, use_stale = _ABLATION_CODES[code]
        return dict(cost=_cost(_closure(function)["numerator"]), use_size=use_size, use_stale=use_stale,
                    floating=False, a=1, b=1, c=1, stale_offset=0, d=d)
    if code not in _FAMILY_CODES:
        raise _Refused("has a score function the compiled core does not implement")
    variables = _closure(function)
    branch = _FAMILY_CODES[code]
    floating = branch == "float64"
    exponents = {k: 1 if branch == "exact_unit" else _number(variables[k], k, integer_only=not floating)
                 for k in ("a", "b", "c")}
    return dict(cost=_cost(variables["numerator"]), use_size=True, use_stale=True, floating=floating,
                **exponents, stale_offset=_number(variables["stale_offset"], "stale_offset", integer_only=False),
                d=d)


def _cost(numerator) -> str:
    cost = _NUMERATORS.get(getattr(numerator, "__code__", None))
    if cost is None:
        raise _Refused("has a cost function the compiled core does not implement")
    return cost


_INT_LIMIT = 2**62


def _number(value, name: str, integer_only: bool):
    """A parameter the core takes as is: an int (bools are ints) or a finite float, >= 0."""
    if type(value) is bool:
        value = int(value)
    if type(value) is int and 0 <= value < _INT_LIMIT:
        return value
    if not integer_only and type(value) is float and 0 <= value < float("inf"):
        return value
    kinds = "an int" if integer_only else "an int or a float"
    raise _Refused(f"has {name}={value!r}; the compiled core takes {kinds} in [0, 2^62)")
