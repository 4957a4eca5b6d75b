"""Operator cost models for recorded traces: FLOPs and a GPU roofline.

``flops``: ``torch.utils.flop_counter``'s formulas for matmuls, convolutions and
attention (a multiply-add counts 2), one FLOP per element produced or written for
every other operator, 0 for views.

``roofline:GPU``: the time the operator would take on that GPU if it ran at the
roofline, ``max(FLOPs / peak FLOP/s, bytes moved / memory bandwidth)``, in
nanoseconds (the DTR artifact's unit), rounded up so that an operator that moves
data never costs 0. Bytes moved are the bytes of the tensor arguments read plus the
bytes of the results written (views move nothing and cost 0). Matmul-class
operators (those with a FLOP formula) in 16-bit floats run at the dense tensor-core
peak; everything else, float32 matmuls included, at the float32 (non-tensor-core)
peak, because PyTorch's default float32 matmul precision is "highest" (no TF32).

No kernel launch overheads, no caches, no overlap: a first-order model whose point
is the ratio between compute-bound and memory-bound operators, which FLOPs alone
get wrong (an elementwise operator costs one FLOP per element but reads and writes
several bytes per element).

Both are deterministic: they depend on shapes and dtypes only, so they work on the
meta device (no data) and the same model and torch version give the same trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """Peak dense throughput and memory bandwidth from the vendor's datasheet."""

    name: str
    fp32_flops: float  # FP32, CUDA cores, FLOP/s
    tensor_16bit_flops: float  # BF16/FP16 tensor cores, dense (no sparsity), FLOP/s
    memory_bandwidth: float  # bytes/s
    source: str


T, G = 1e12, 1e9
#: Datasheet numbers (dense, i.e. the "with sparsity" figures halved; SXM parts where
#: the datasheet lists several form factors).
GPUS = {gpu.name: gpu for gpu in (
    GPU("A100", 19.5 * T, 312 * T, 2039 * G,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: FP32 19.5 TFLOPS, BF16 312 TFLOPS, "
        "HBM2e 2,039 GB/s)"),
    GPU("H100", 67 * T, 989.5 * T, 3350 * G,
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: FP32 67 TFLOPS, BF16 1,979 TFLOPS with sparsity, "
        "HBM3 3.35 TB/s)"),
    GPU("H200", 67 * T, 989.5 * T, 4800 * G,
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: FP32 67 TFLOPS, BF16 1,979 TFLOPS with sparsity, "
        "HBM3e 4.8 TB/s)"),
    GPU("L4", 30.3 * T, 121.25 * T, 300 * G,
        "NVIDIA L4 Tensor Core GPU datasheet (FP32 30.3 TFLOPS, BF16 242.5 TFLOPS with sparsity, "
        "GDDR6 300 GB/s)"),
)}

COST_MODELS = ("time", "flops", *(f"roofline:{name}" for name in GPUS))


def check_cost_model(cost: str) -> str:
    if cost not in COST_MODELS:
        raise ValueError(f"unknown cost model {cost!r}; choose one of {', '.join(COST_MODELS)}")
    return cost


def roofline_gpu(cost: str) -> GPU | None:
    """The GPU of a ``roofline:GPU`` cost model, else None."""
    if cost.startswith("roofline:"):
        return GPUS[cost.split(":", 1)[1]]
    return None


def roofline_ns(gpu: GPU, flops: int, bytes_moved: int, matmul_16bit: bool) -> int:
    """Roofline time in ns, rounded up; 0 only for an operator that computes and moves nothing."""
    peak = gpu.tensor_16bit_flops if matmul_16bit else gpu.fp32_flops
    seconds = max(flops / peak, bytes_moved / gpu.memory_bandwidth)
    return math.ceil(seconds * 1e9)
