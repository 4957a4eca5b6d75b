"""The GPU check of real execution (scripts/validate_allocator_cuda.py calls it; docs/execute.md, CUDA)."""

from __future__ import annotations

import subprocess

import torch

from ..runtime import simulate
from .step import capture_step, reference_step, run_step


def check_execution(source: str, ratios, *, policy: str = "dtr", rtol: float = 1e-4, **build_options) -> list[dict]:
    """Real execution on the GPU against the simulator, one record per ratio (scripts/validate_allocator_cuda.py).

    The trace is recorded on the GPU (its kernels differ from the CPU's); each run caps the caching
    allocator at the budget. A record holds the status, whether the decisions equal
    ``dtrlab.simulate`` on that trace, the real allocator's peaks beside the ``caching`` model's
    prediction for the budget, and for a passing run the largest difference of the loss and
    gradients from an unbudgeted eager step (CUDA kernels are not all deterministic).
    """
    if not torch.cuda.is_available():
        raise ValueError(f"no CUDA device (torch {torch.__version__}, built with CUDA {torch.version.cuda})")
    captured = capture_step(source, device="cuda", **build_options)
    loss, gradients, _ = reference_step(source, device="cuda", **build_options)
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
    try:  # the driver's version is not in torch's device properties
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = None
    return {"device": props.name, "memory_bytes": props.total_memory, "driver": driver, "torch": torch.__version__,
            "cuda": torch.version.cuda}
