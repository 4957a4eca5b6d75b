"""The real CUDA caching allocator beside the simulator's accounting (only where CUDA is available).

On CUDA the simulator still decides (flat bytes or a memory model such as ``caching``); this
module measures what PyTorch's caching allocator really did during the step, and can cap it
at the budget with ``torch.cuda.set_per_process_memory_fraction`` so that a step the
allocator cannot hold fails with the allocator's own out-of-memory error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def allocator_scope(device: str, budget_bytes: int, cap: bool) -> Iterator[dict]:
    """Reset the allocator's peak counters, optionally cap it at ``budget_bytes``, and fill the yielded dict
    with its peaks (``peak_allocated_bytes``, ``peak_reserved_bytes``) and the cap when the block ends."""
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available (torch {torch.__version__}, "
                         f"built with CUDA {torch.version.cuda})")
    index = torch.device(device).index or 0
    torch.cuda.synchronize(index)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(index)
    total = torch.cuda.mem_get_info(index)[1]
    before = torch.cuda.memory_allocated(index)
    peaks: dict = {"allocated_before_bytes": before}
    if cap:
        # The allocator caps at fraction x total: the budget on top of what is already allocated.
        fraction = min(1.0, (before + budget_bytes) / total)
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        peaks["fraction"] = fraction
    try:
        yield peaks
    finally:
        torch.cuda.synchronize(index)
        peaks.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(index),
                     peak_reserved_bytes=torch.cuda.max_memory_reserved(index))
        if cap:
            torch.cuda.set_per_process_memory_fraction(1.0, index)

