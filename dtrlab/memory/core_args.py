"""A memory model's compiled form: the arguments of its C twin (``_memory_core.h``).

Each model the C code knows describes itself by :meth:`~dtrlab.memory.MemoryModel.core_args`:
the argument tuple of ``memory_init`` (and of :class:`dtrlab.memory._compiled.MemoryCore`),
``(kind, capacity, granularity, expandable, max_split, divisions, limit_before_mapping,
reuse_addresses)``, or None where the C code does not model the instance: a class it does not
know (a user-registered model, or a subclass that may override a rule), or values it cannot hold
(above 2^62 bytes, divisions above 2^30). The replay core (``dtrlab.runtime._core``) builds its
model from the same tuple.
"""

from __future__ import annotations

MEM_BYTES, MEM_CACHING = 0, 1  # the kinds of _memory_core.h
MAX_BYTES = 1 << 62  # MEM_MAX_BYTES: the largest capacity and granularity the C models take
MAX_DIVISIONS = 1 << 30
NO_SPLIT = -1
NO_DIVISIONS = (0,) * 16  # MEM_ROUNDUP_INTERVALS: a byte counter rounds to no power-of-2 division


def byte_counting_args(capacity_bytes: int, granularity: int) -> tuple | None:
    """The C byte counter's arguments (flat: granularity 1), or None beyond what it holds."""
    if capacity_bytes > MAX_BYTES or granularity > MAX_BYTES:
        return None
    return (MEM_BYTES, capacity_bytes, granularity, False, NO_SPLIT, NO_DIVISIONS, False, False)
