"""The real CPU peak of a piece of work: torch.profiler's memory events, summed in time order.

:func:`cpu_peak_bytes` runs ``work()`` under ``torch.profiler.profile(profile_memory=True)``
and returns the most bytes the CPU allocator had handed out at once during it, above what
was allocated when it began (every ``[memory]`` event is one allocation, positive bytes, or
one free, negative; frees of storages allocated before ``work`` count against the running
sum, so the peak is relative to the start). This is what the traces' predicted peaks are
checked against (tests/test_partition.py for torch.compile's partitioned step,
tests/test_checkpointing.py for checkpointing plans): the prediction minus the bytes live
before the step. :func:`cuda_memory_profile` is the same question asked of CUDA's caching allocator, for a call
run on a GPU (dtrlab.trace.op_temporaries).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch


def cpu_peak_bytes(work: Callable[[], object]) -> int:
    """Peak CPU allocator bytes during ``work()`` above the bytes allocated when it starts."""
    gc.collect()
    return cpu_memory_profile(work)[0]


def cpu_memory_profile(work: Callable[[], object]) -> tuple[int, int]:
    """CPU allocator bytes during ``work()`` above those allocated when it starts: (the peak, at its end). No
    collection first: a recording calls it mid-step (dtrlab.trace.op_temporaries), where a collection would move
    the step's releases."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        work()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak, live


def cuda_memory_profile(work: Callable[[], object]) -> tuple[int, int]:
    """CUDA caching allocator bytes during ``work()`` above those allocated when it starts: (the peak, at its end),
    as ``torch.cuda.max_memory_allocated`` counts them (each block rounded up to 512 bytes; what cuDNN's workspaces
    take goes through this allocator). The device is synchronised before and after, so that the kernels ``work``
    queued have run."""
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    work()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start, torch.cuda.memory_allocated() - start
