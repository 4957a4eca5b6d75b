"""A Python memory model as the arguments of the compiled one (``_memory_core.h``).

:func:`core_memory_args` turns a :class:`~dtrlab.memory.MemoryModel` instance into the
argument tuple of ``memory_init`` (and of ``dtrlab.runtime._memory.MemoryCore``):
``(kind, capacity, granularity, expandable, max_split, divisions, limit_before_mapping,
reuse_addresses)``, or None where the C code does not model it: a class it does not know
(a user-registered model, or a subclass that may override a rule), or values it cannot
hold (above 2^62 bytes, divisions above 2^30).
"""

from __future__ import annotations

from ..memory import AlignedModel, CachingModel, FlatModel, MemoryModel
from ..memory.caching import _divisions_table

MEM_BYTES, MEM_CACHING = 0, 1  # the kinds of _memory_core.h
MAX_BYTES = 1 << 62  # MEM_MAX_BYTES: the largest capacity and granularity the C models take
MAX_DIVISIONS = 1 << 30
NO_SPLIT = -1


def core_memory_args(model: MemoryModel) -> tuple | None:
    """The compiled model's constructor arguments for ``model`` (capacity and effective options), or None."""
    if model.capacity_bytes > MAX_BYTES:
        return None
    no_divisions = (0,) * 16
    if type(model) is FlatModel:
        return (MEM_BYTES, model.capacity_bytes, 1, False, NO_SPLIT, no_divisions, False, False)
    if type(model) is AlignedModel:
        granularity = model.options()["granularity"]
        if granularity > MAX_BYTES:
            return None
        return (MEM_BYTES, model.capacity_bytes, granularity, False, NO_SPLIT, no_divisions, False, False)
    if type(model) is CachingModel:
        options = {name: default for name, (default, _) in CachingModel.option_specs.items()} | model.options()
        divisions = tuple(_divisions_table(options["roundup_power2_divisions"]))
        if max(divisions) > MAX_DIVISIONS:
            return None
        max_split = options["max_split_size"]
        if max_split is not None and max_split > MAX_BYTES:
            return None
        return (MEM_CACHING, model.capacity_bytes, 1, options["expandable_segments"],
                NO_SPLIT if max_split is None else max_split, divisions,
                options["limit_check"] == "allocation_size", options["address_policy"] == "reuse")
    return None
