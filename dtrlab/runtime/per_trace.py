"""A cache of per-trace results, for the baseline and the compiled core's flattened trace."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import wraps

from ..trace.model import Trace


def cache_per_trace(function: Callable[[Trace], object]) -> Callable[[Trace], object]:
    """Cache ``function(trace)`` per Trace object, for as long as that object lives.

    Keyed on the object's identity: hashing a Trace (all its operators) would cost
    more than a small replay.
    """
    results: dict[int, tuple[weakref.ref, object]] = {}

    @wraps(function)
    def cached(trace: Trace):
        key = id(trace)
        entry = results.get(key)
        if entry is not None and entry[0]() is trace:
            return entry[1]
        result = function(trace)
        results[key] = (weakref.ref(trace, lambda _, key=key: results.pop(key, None)), result)
        return result

    return cached
