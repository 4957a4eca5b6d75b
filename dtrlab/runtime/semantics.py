"""``Semantics``: what a run means, as one frozen value that travels through every layer.

A run's outcome depends on the budget, the policy, and these five choices: the memory model and
its options, the runtime semantics (``enforce``), the device capacity under ``"allocated"`` and
the overhead limit. They used to travel as five loose keyword arguments through every simulate,
sweep, census, intervention and execution function; now they travel as one ``Semantics``.
``Semantics()`` is simrd's reference configuration: flat memory, ``reserved``, no device, 2.0.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace

from .simulator import RESERVED

FLAT = "flat"
DEFAULT_OVERHEAD_LIMIT = 2.0


@dataclass(frozen=True)
class Semantics:
    """The memory model (``memory``, ``memory_options``), the runtime semantics (``enforce``,
    ``device_capacity``) and the thrash limit (``overhead_limit``) of a run; see
    :func:`dtrlab.simulate` for each. ``overhead_limit=math.inf`` is no limit.

    ``memory_options`` may be given as a dict; it is held as sorted ``(name, value)`` pairs, so
    equal configurations compare and hash equal and a ``Semantics`` can key a dict. Names and
    options are validated where a run is built (:func:`dtrlab.runtime.memory_spec`,
    :func:`dtrlab.runtime.check_semantics`), with the same one-line errors as before.
    """

    memory: object = FLAT  # a registered name, or a MemoryModel instance standing for its name and options
    memory_options: tuple = ()
    enforce: str = RESERVED
    device_capacity: object = None
    overhead_limit: float = DEFAULT_OVERHEAD_LIMIT

    def __post_init__(self):
        options = self.memory_options or {}
        pairs = options.items() if isinstance(options, Mapping) else options
        object.__setattr__(self, "memory_options", tuple(sorted((str(k), v) for k, v in pairs)))
        limit = self.overhead_limit
        if not (isinstance(limit, numbers.Real) and limit >= 1):  # `>=` is False for nan
            raise ValueError(f"overhead_limit must be a number >= 1 (2.0 allows as much recompute as compute; "
                             f"math.inf is no limit), got {limit!r}")

    @property
    def options(self) -> dict:
        """``memory_options`` as a plain dict (a copy)."""
        return dict(self.memory_options)

    @property
    def unlimited(self) -> bool:
        """Whether runs have no thrash limit (``overhead_limit=math.inf``)."""
        return math.isinf(self.overhead_limit)

    def with_(self, **changes) -> "Semantics":
        """A copy with ``changes`` (``Semantics().with_(memory="caching")``)."""
        return replace(self, **changes)


REFERENCE = Semantics()
