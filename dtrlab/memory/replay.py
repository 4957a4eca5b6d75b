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
from typing import Callable

from ..trace.model import COMPUTE, GET, RELEASE, Operator, Trace
from .base import MemoryModel


@dataclass(frozen=True)
class MemoryEvent:
    """``alloc`` of ``size`` bytes for ``block_id``, or ``free`` of its block (size repeated)."""

    kind: str  # "alloc" or "free"
    block_id: int
    size: int


def walk_unbounded(trace: Trace, computed: Callable[[Operator, list[tuple[int, int]]], None],
                   freed: Callable[[int, int], None]) -> None:
    """Walk ``trace``'s schedule as the unbounded baseline does (simrd's V1 runtime at an
    infinite budget), the one copy of that walk.

    ``computed(op, allocated)`` is called once a compute has placed its outputs, with the
    ``(storage id, size)`` of each non-alias output in output order, before the compute frees
    its unreferenced arguments; ``freed(storage id, size)`` whenever a resident storage loses
    its last external reference (pinned ones too: V1 unpins to banish). At an infinite budget
    every pinned tensor is already resident, so PIN does nothing.
    """
    operators = trace.operators
    storage = [-1] * trace.n_tensors
    size = [0] * trace.n_tensors
    ref_ext = [0] * trace.n_tensors
    resident = [False] * trace.n_tensors

    def free_if_unreferenced(s: int) -> None:
        if ref_ext[s] == 0 and resident[s]:
            resident[s] = False
            freed(s, size[s])

    for kind, operand in trace.schedule:
        if kind == COMPUTE:
            op = operators[operand]
            allocated = []
            for index, t in enumerate(op.outputs):
                alias = op.aliases[index]
                s = t if alias == -1 else storage[op.args[alias]]
                storage[t] = s
                if alias == -1:
                    size[s] = op.sizes[index]
                    resident[s] = True
                    allocated.append((s, size[s]))
                ref_ext[s] += 1
            computed(op, allocated)
            for p in op.args:
                free_if_unreferenced(storage[p])
        elif kind == GET:
            ref_ext[storage[operand]] += 1
        elif kind == RELEASE:
            s = storage[operand]
            ref_ext[s] -= 1
            free_if_unreferenced(s)


def unbounded_events(trace: Trace) -> list[MemoryEvent]:
    events: list[MemoryEvent] = []

    def computed(op: Operator, allocated: list[tuple[int, int]]) -> None:
        events.extend(MemoryEvent("alloc", s, size) for s, size in allocated)

    walk_unbounded(trace, computed, lambda s, size: events.append(MemoryEvent("free", s, size)))
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
