"""A trace's peaks without a budget under the flat and the caching accountings.

:func:`trace_peaks` replays a trace's unbounded allocation sequence
(:func:`dtrlab.memory.replay.unbounded_events`) through a flat byte counter and PyTorch's
caching-allocator model (default options, no capacity): ``flat_peak`` (bytes of live
storages), ``allocated_peak`` (requests rounded as ``torch.cuda.max_memory_allocated``
counts them) and ``reserved_peak`` (segments, as ``torch.cuda.max_memory_reserved``).
Used for torch.compile's partitioned steps (:func:`dtrlab.memory.partitioned.step_peaks`)
and activation-checkpointing plans (:mod:`dtrlab.trace.checkpointing`).
"""

from __future__ import annotations

from ..trace.model import Trace
from .caching import CachingModel
from .flat import FlatModel
from .replay import replay, unbounded_events

#: Capacity for the unbounded replays: no model ever refuses an allocation.
UNBOUNDED = 1 << 62


def trace_peaks(trace: Trace) -> dict:
    """``{"flat_peak", "allocated_peak", "reserved_peak"}`` of an unbounded replay of ``trace``, in bytes."""
    events = unbounded_events(trace)
    peaks = {}
    for label, model in (("flat", FlatModel(UNBOUNDED)), ("caching", CachingModel(UNBOUNDED))):
        applied = replay(model, events)
        assert applied == len(events), "an unbounded replay refused an allocation"
        peaks[label] = model.stats()
    return {"flat_peak": peaks["flat"].peak_allocated_bytes,
            "allocated_peak": peaks["caching"].peak_allocated_bytes,
            "reserved_peak": peaks["caching"].peak_reserved_bytes}
