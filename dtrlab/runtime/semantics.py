"""``Semantics``: what a run means, as one frozen value that travels through every layer.

A run's outcome depends on the budget, the policy, and these five choices: the memory model and
its options, the runtime semantics (``enforce``), the device capacity under ``"allocated"`` and
the overhead limit. They used to travel as five loose keyword arguments through every simulate,
sweep, census, intervention and execution function; now they travel as one ``Semantics``.
``Semantics()`` is simrd's reference configuration: flat memory, ``reserved``, no device, 2.0.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from ..memory import MEMORY_MODELS, MemoryModel, get_memory_model
from ..memory.device import DeviceCapacity, device_capacity as parse_device_capacity
from ..policies import Policy
from ..suggest import did_you_mean
from .simulator import ALLOCATED, RESERVED, SEMANTICS

FLAT = "flat"
DEFAULT_OVERHEAD_LIMIT = 2.0


@dataclass(frozen=True)
class Semantics:
    """The memory model (``memory``, ``memory_options``), the runtime semantics (``enforce``,
    ``device_capacity``) and the thrash limit (``overhead_limit``) of a run; see
    :func:`dtrlab.simulate` for each. ``overhead_limit=math.inf`` is no limit.

    ``memory_options`` may be given as a dict; it is held as sorted ``(name, value)`` pairs, so
    equal configurations compare and hash equal and a ``Semantics`` can key a dict. Names and
    options are validated where a run is built, or by :meth:`normalized`, with one-line errors.
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

    def normalized(self, policy: Policy | None = None) -> "Semantics":
        """This configuration as runs record it and caches key it: the memory model's name and effective
        options (:func:`memory_spec`; a model instance stands for them) and the device capacity's label
        (``"1.25x"``, None under ``"reserved"``). Validates every field (:func:`check_semantics`, also
        against ``policy`` when given); normalizing twice changes nothing."""
        device = check_semantics(self.enforce, self.device_capacity, policy)
        memory, options = memory_spec(self.memory, self.options, self.enforce)
        return replace(self, memory=memory, memory_options=options,
                       device_capacity=None if device is None else device.label)

    def require_default(self, names: tuple[str, ...], why: str) -> None:
        """A ``ValueError`` when a field of ``names`` differs from the reference's: a function whose own
        arguments set these (``why`` says which) refuses a semantics that sets them too."""
        set_ = [name for name in names if getattr(self, name) != getattr(REFERENCE, name)]
        if set_:
            raise ValueError(f"semantics sets {', '.join(set_)}, which {why}; leave them at their defaults")

    @classmethod
    def from_row(cls, row: Mapping) -> "Semantics":
        """The semantics a sweep frame's row was simulated under (frames saved before the memory columns
        were all flat memory under ``"reserved"``)."""
        enforce = row.get("enforce") or RESERVED
        return cls(memory=row.get("memory") or FLAT,
                   memory_options=json.loads(row["memory_options"]) if row.get("memory_options") else (),
                   enforce=enforce,
                   device_capacity=(row.get("device_capacity") or None) if enforce != RESERVED else None,
                   overhead_limit=float(row["overhead_limit"]))


REFERENCE = Semantics()


def refuse_loose(params: Mapping, value: type = Semantics, where: str = "semantics") -> None:
    """A ``TypeError`` for keywords that now travel inside ``value`` (a frozen dataclass), so that old code
    passing ``memory=`` or ``jobs=`` fails loudly instead of reaching a policy's parameters."""
    loose = sorted(set(params) & {f.name for f in fields(value)})
    if loose:
        given = ", ".join(f"{name}={params[name]!r}" for name in loose)
        raise TypeError(f"{', '.join(loose)}: pass them as {where}={value.__name__}({given}), not as loose keywords")


def check_semantics(enforce: str, device_capacity=None, policy: Policy | None = None) -> DeviceCapacity | None:
    """The normalized device capacity of ``enforce="allocated"`` (None under ``"reserved"``, which
    takes none); refuses an unknown semantics and policies that evict to place a block."""
    if enforce not in SEMANTICS:
        raise ValueError(f"unknown enforce {enforce!r}{did_you_mean(enforce, SEMANTICS)}; valid: "
                         f"{', '.join(SEMANTICS)} (see docs/memory.md)")
    if enforce == RESERVED:
        if device_capacity is not None:
            raise ValueError("device_capacity applies to enforce='allocated' only (under 'reserved' the budget is "
                             "the device)")
        return None
    if policy is not None and getattr(policy, "address_aware", False):
        raise ValueError(f"policy {policy.name!r} evicts to place a block, which enforce='allocated' never asks for "
                         "(it evicts by allocated bytes after each operator); use enforce='reserved'")
    return parse_device_capacity(device_capacity)


def memory_spec(memory: str | MemoryModel = FLAT, options: dict | None = None,
                enforce: str = RESERVED) -> tuple[str, dict]:
    """``(name, effective options)`` of a memory model given by name and options, or by instance.

    Validates both (an unknown model or option is an error listing the valid ones);
    the effective options have every default filled in, so that equal
    configurations compare (and key caches) equal. Under ``enforce="allocated"`` the
    defaults are that semantics' (:func:`semantics_options`).
    """
    if memory == FLAT and not options and enforce == RESERVED:
        return FLAT, {}
    if isinstance(memory, MemoryModel):
        instance = get_memory_model(memory, None, **(options or {}))  # options with an instance are refused
        memory, options = instance.name, instance.options()
    model = get_memory_model(memory, 0, **semantics_options(memory, options, enforce))
    return model.name, model.options()


def semantics_options(memory: str, options: dict | None, enforce: str) -> dict:
    """``options`` with the defaults of ``enforce``: under ``"allocated"`` the caching model checks
    the device limit as PyTorch's ``alloc_block`` checks a per-process limit, with
    ``get_allocation_size`` before mapping (``limit_check="allocation_size"``), unless given."""
    options = dict(options or {})
    if enforce == ALLOCATED and "limit_check" in MEMORY_MODELS.get(memory, MemoryModel).option_specs:
        options.setdefault("limit_check", "allocation_size")
    return options
