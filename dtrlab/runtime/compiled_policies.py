"""Which policies the compiled core runs, and their encoding for it (the spec tuple).

:func:`policy_spec` turns a policy instance into the tuple that ``_core.replay`` decodes
(``_policy_spec.h``); :func:`policy_reason` says why a policy stays on the Python
simulator. A spec is built afresh for every run: it carries the run's own seeded
random generator.
"""

from __future__ import annotations

import random

from ..policies.builtin import DTR, LRU, MSPS, DTREqClass, DTRLocal, LargestStorage, RandomStorage

#: The built-in policy classes (exactly these classes, not subclasses), mapped to the core's codes.
POLICY_CODES = {DTR: 0, DTREqClass: 1, DTRLocal: 2, MSPS: 3, LRU: 4, LargestStorage: 5, RandomStorage: 6}


def policy_reason(policy) -> str | None:
    """Why the core cannot run ``policy``, or None when it can."""
    if type(policy) not in POLICY_CODES:
        return f"policy {policy.label!r} is not one of the compiled built-ins ({', '.join(c.name for c in POLICY_CODES)})"
    if {"score_of", "choose", "score", "start"} & set(vars(policy)):
        return f"policy {policy.label!r} has methods overridden on the instance"
    return None


def policy_spec(policy) -> tuple | None:
    """The core's spec tuple for ``policy``, or None when :func:`policy_reason` refuses it."""
    if policy_reason(policy) is not None:
        return None
    # The random policy's own generator, seeded as its start() does: the same draws in the same order.
    randrange = random.Random(policy.params["seed"]).randrange if type(policy) is RandomStorage else None
    return (POLICY_CODES[type(policy)], randrange)
