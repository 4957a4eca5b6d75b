"""The allocation/free sequence of a trace's unbounded replay, to drive a memory model alone.

The sequence follows the unbounded baseline (``dtrlab.runtime.baseline``, simrd's
V1 runtime at an infinite budget): a compute allocates each of the operator's
non-alias outputs in output order, then frees every argument storage left without
an external reference; a release frees its storage once no external reference is
left (pinned storages included). Block ids are storage ids (the root tensor's id),
as in the simulator. ``scripts/validate_allocator_cuda.py`` replays this sequence
with real CUDA tensors and compares the caching allocator with the ``caching`` model.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace.model import COMPUTE, GET, RELEASE, Trace
from .base import MemoryModel


@dataclass(frozen=True)
class MemoryEvent:
    """``alloc`` of ``size`` bytes for ``block_id``, or ``free`` of its block (size repeated)."""

    kind: str  # "alloc" or "free"
    block_id: int
    size: int


def unbounded_events(trace: Trace) -> list[MemoryEvent]:
    operators = trace.operators
    storage = [-1] * trace.n_tensors
    size = [0] * trace.n_tensors
    ref_ext = [0] * trace.n_tensors
    resident = [False] * trace.n_tensors
    events: list[MemoryEvent] = []

    def free_if_unreferenced(s: int) -> None:
        if ref_ext[s] == 0 and resident[s]:
            resident[s] = False
            events.append(MemoryEvent("free", s, size[s]))

    for kind, operand in trace.schedule:
        if kind == COMPUTE:
            op = operators[operand]
            for index, t in enumerate(op.outputs):
                alias = op.aliases[index]
                s = t if alias == -1 else storage[op.args[alias]]
                storage[t] = s
                if alias == -1:
                    size[s] = op.sizes[index]
                    resident[s] = True
                    events.append(MemoryEvent("alloc", s, size[s]))
                ref_ext[s] += 1
            for p in op.args:
                free_if_unreferenced(storage[p])
        elif kind == GET:
            ref_ext[storage[operand]] += 1
        elif kind == RELEASE:
            s = storage[operand]
            ref_ext[s] -= 1
            free_if_unreferenced(s)
    return events


def replay(model: MemoryModel, events: list[MemoryEvent]) -> int:
    """Apply ``events`` to ``model``; return how many were applied (all, unless an alloc failed:
    then the index of the failing event, with the model in the state the failure left)."""
    for index, event in enumerate(events):
        if event.kind == "alloc":
            if not model.allocate(event.block_id, event.size):
                return index
        else:
            model.free(event.block_id)
    return len(events)
