"""The policies' compiled form: the spec tuple the replay core decodes (``_policy_spec.h``).

Every policy the core runs describes itself by :meth:`~dtrlab.policies.Policy.core_spec`;
:func:`policy_spec` builds a run's spec and :func:`policy_reason` says why a policy stays
on the Python simulator. The core runs

* simrd's seven built-ins (``P_DTR`` ... ``P_RANDOM``: :data:`dtrlab.policies.builtin.POLICY_CODES`);
* every score formula of this package (``P_FORMULA``, :class:`Formula`): the score family
  with all its parameters (the nine variants), ``score_search`` and the searched policies,
  the 16 ablations;
* ``twophase`` whose two phases are any of those (``P_TWOPHASE``);
* the address-aware ``coop`` and ``dtr_fit`` (``P_COOP``, ``P_DTR_FIT``; under a memory
  model that knows addresses).

A spec describes the code the reference would run: each ``core_spec`` checks with
:func:`runs_own` that neither a subclass nor the instance replaced a method it describes
(such a policy runs something else and stays on the Python simulator, as does a
:func:`~dtrlab.policies.score_policy` function). A spec is built afresh for every run: it
carries the run's own seeded random generator.

The spec tuples: ``(code, randrange)`` for a built-in (``randrange`` None but for
``P_RANDOM``); :meth:`Formula.spec`'s tuple; ``(P_TWOPHASE, phase1 spec, phase2 spec)``;
``(P_COOP, None, cost code)``; ``(P_DTR_FIT, None)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import NotCompiled, SpecBuild

# The policy codes of _policy_spec.h, in its enum's order.
(P_DTR, P_DTR_EQ_CLASS, P_DTR_LOCAL, P_MSPS, P_LRU, P_LARGEST_STORAGE, P_RANDOM, P_FORMULA, P_TWOPHASE, P_COOP,
 P_DTR_FIT) = range(11)
#: The compute a formula charges an eviction (ablations.COSTS' keys), as _policy_spec.h's codes.
COST_CODES = {"estar": 0, "eqclass": 1, "local": 2, "nocost": 3}
#: The methods through which a policy decides: set on an instance, they replace what its spec describes.
POLICY_METHODS = ("score", "score_of", "choose", "start")


def policy_spec(policy) -> tuple | None:
    """The core's spec tuple for a run of ``policy``, or None when :func:`policy_reason` refuses it."""
    try:
        return SpecBuild(policy).spec_of(policy)
    except NotCompiled:
        return None


def policy_reason(policy) -> str | None:
    """Why the core cannot run ``policy``, or None when it can."""
    try:
        SpecBuild(policy).spec_of(policy)
    except NotCompiled as refused:
        return f"policy {_label(policy)!r} {refused}"
    return None


def _label(policy) -> str:
    try:
        return policy.label
    except Exception:  # a broken user policy still gets its reason
        return type(policy).__name__


def runs_own(policy, owner: type, methods: tuple[str, ...], set_by_init: tuple[str, ...] = ()) -> None:
    """Refuse ``policy`` unless it runs ``owner``'s ``methods``: none redefined by a subclass, and
    none of them (nor of :data:`POLICY_METHODS`) set on the instance, but those its own
    ``__init__`` sets (``set_by_init``, which the caller checks itself)."""
    on_instance = sorted((set(POLICY_METHODS) | set(methods)) & set(vars(policy)) - set(set_by_init))
    if on_instance:
        raise NotCompiled(f"has {', '.join(on_instance)} overridden on the instance")
    redefined = [name for name in methods if getattr(type(policy), name) is not getattr(owner, name)]
    if redefined:
        raise NotCompiled(f"defines its own {', '.join(redefined)}")


@dataclass(frozen=True)
class Formula:
    """One score formula (``P_FORMULA``)::

        cost^a / ([size^b] x [(staleness + stale_offset)^c]) x (1 + evicted neighbours)^d

    the bracketed factors present when ``use_size`` / ``use_stale`` (without both, the score is
    the bare integer cost: an ablation); exact ``int / int`` arithmetic, or float64 throughout
    (``floating``). The values are those the score function closes over.
    """

    cost: str  # a key of COST_CODES
    use_size: bool = True
    use_stale: bool = True
    floating: bool = False
    a: int | float = 1
    b: int | float = 1
    c: int | float = 1
    stale_offset: int | float = 0
    d: int | float = 0

    def spec(self, tie_by_id: bool = False) -> tuple:
        """The spec tuple (``tie_by_id``: the minimal score, ties to the smallest storage id, instead of
        simrd's scan); refuses a parameter the core cannot hold."""
        d = _number(self.d, "d", False)
        exact = not self.floating
        return (P_FORMULA, None, COST_CODES[self.cost], self.use_size, self.use_stale, self.floating, tie_by_id,
                _number(self.a, "a", exact), _number(self.b, "b", exact), _number(self.c, "c", exact),
                _number(self.stale_offset, "stale_offset", False), d)


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
    raise NotCompiled(f"has {name}={value!r}; the compiled core takes {kinds} in [0, 2^62)")
