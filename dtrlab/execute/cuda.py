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


def check_execution(source: str, ratios, *, policy: str = "dtr", rtol: float = 1e-4, **build_options) -> list[dict]:
    """Real execution on the GPU against the simulator, one record per ratio (scripts/validate_allocator_cuda.py).

    The trace is recorded on the GPU (its kernels differ from the CPU's); each run caps the caching
    allocator at the budget. A record holds the status, whether the decisions equal
    ``dtrlab.simulate`` on that trace, the real allocator's peaks beside the ``caching`` model's
    prediction for the budget, and for a passing run the largest difference of the loss and
    gradients from an unbudgeted eager step (CUDA kernels are not all deterministic).
    """
    from ..runtime import simulate
    from .step import capture_step, reference_step, run_step

    if not torch.cuda.is_available():
        raise ValueError(f"no CUDA device (torch {torch.__version__}, built with CUDA {torch.version.cuda})")
    captured = capture_step(source, device="cuda", **build_options)
    loss, gradients = reference_step(source, device="cuda", **build_options)
    records = []
    for ratio in ratios:
        simulated = simulate(captured.trace, policy, ratio=ratio)
        predicted = simulate(captured.trace, policy, ratio=ratio, memory="caching")
        record = {"model": source, "ratio": ratio, "simulated": simulated.status,
                  "caching_model": predicted.status, "caching_model_peak_reserved": predicted.peak_reserved_bytes}
        try:
            executed = run_step(captured, ratio=ratio, policy=policy, cap_allocator=True)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            records.append({**record, "status": "allocator_oom", "identical": None})
            continue
        record.update(status=executed.status, identical=executed.run == simulated, evictions=executed.run.evictions,
                      wall_seconds=executed.wall_seconds, **executed.allocator)
        if executed.passed:
            differences = [(executed.loss - loss).abs().max().item()]
            differences += [(executed.gradients[k] - g).abs().max().item() for k, g in gradients.items()]
            close = torch.allclose(executed.loss, loss, rtol=rtol) and all(
                torch.allclose(executed.gradients[k], g, rtol=rtol, atol=rtol) for k, g in gradients.items())
            record.update(largest_difference=max(differences), within_tolerance=close)
        records.append(record)
    return records


def device_description() -> dict:
    """The GPU, driver and torch version, for docs/execute.md's records."""
    props = torch.cuda.get_device_properties(0)
    return {"device": props.name, "memory_bytes": props.total_memory, "torch": torch.__version__,
            "cuda": torch.version.cuda}
