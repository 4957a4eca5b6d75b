"""A named GPU's answers to Inductor's device queries, on a machine without one, inside the lowering only.

API::

    with gpu_target("H100-80GB"):         # torch.cuda answers as an H100 (capability 9.0, 132 SMs)
        ...                                # Inductor lowers graphs of fake CUDA tensors
    torch.cuda.is_available()              # False again: every patched name is restored

Inductor asks the device what it is while it lowers and schedules a graph for CUDA: whether
CUDA is available and Triton can run on it, the device's properties (SM count, capability,
warp size, registers: ``DeviceProperties.create``, torch/_inductor/runtime/hints.py:189-223),
its capability (``CudaInterface.get_compute_capability``,
torch/_dynamo/device_interface.py:273-278), its bf16 support (compile_fx.py:3419), its RNG
state (saved around code generation: ``preserve_rng_state``, torch/_dynamo/utils.py:2711-2729)
and the current device (the device guard's exchange, device_interface.py:262-263). On a
machine with no GPU each of these initialises CUDA and fails. :func:`gpu_target` makes them
answer as :data:`GPU_TARGETS`' GPU, for the duration of the ``with`` block:

* ``torch.cuda``'s functions (:data:`_CUDA_ANSWERS`); the copies of them that
  ``CudaInterface`` bound at import as static methods (device_interface.py:252-265) and its
  ``Worker``'s (:218-250, whose property list is cached in ``caching_worker_device_properties``);
* Triton's backend target: ``triton.runtime.driver.active.get_current_target()`` asks the CUDA
  driver; it answers ``GPUTarget("cuda", <capability>, 32)``, read by Inductor's Triton
  kernel code generation (torch/_inductor/runtime/triton_helpers.py:100);
* the caches that keep answers across calls are cleared on entry and on exit, so no answer
  leaks in or out (:func:`_clear_device_caches`): ``has_triton``'s (a ``functools.cache``,
  torch/utils/_triton.py:208) and its neighbours', ``DeviceProperties.create``'s (hints.py:190),
  torch._inductor.utils' (``is_big_gpu``, ``get_max_num_sms``, ...) and the Worker's property list.

The Triton kernels Inductor generates are never compiled (dtrlab.trace.torch_compile.inductor takes the wrapper's
source before its module loads them). Triton must be installed (a CUDA build of torch pulls it in):
Inductor generates Triton kernels for CUDA only when ``has_triton()`` (torch/utils/_triton.py:209)
finds the ``triton`` package with its ``nvidia`` backend.

Not thread-safe: the patches are process-wide while the block runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...suggest import did_you_mean

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


@dataclass(frozen=True)
class GpuTarget:
    """A GPU as ``torch.cuda.get_device_properties`` describes it: the fields Inductor reads.

    An instance stands for the properties object itself (``torch._C._CudaDeviceProperties``'s field names).
    """

    name: str
    major: int
    minor: int
    multi_processor_count: int
    #: Nominal memory (the marketing size in GiB, dtrlab.memory.device's preset); a real device's
    #: ``totalGlobalMem`` is a little less. Inductor's lowering does not read it.
    total_memory: int
    max_threads_per_multi_processor: int
    shared_memory_per_block_optin: int
    shared_memory_per_multiprocessor: int
    L2_cache_size: int  # noqa: N815 - torch's field name
    regs_per_multiprocessor: int = 64 * KiB
    warp_size: int = 32
    max_threads_per_block: int = 1024
    shared_memory_per_block: int = 48 * KiB
    gcnArchName: str = "NVIDIA CUDA GPU"  # noqa: N815 - torch's field name (ROCm's architecture, read on ROCm only)
    is_integrated: int = 0

    @property
    def capability(self) -> int:
        """``major * 10 + minor``: Triton's and Inductor's ``cc`` (90 for an H100)."""
        return self.major * 10 + self.minor


# Sources. SMs and memory: NVIDIA's product datasheets (A100 Tensor Core GPU datasheet: 108 SMs; H100 SXM5
# in the H100 Tensor Core GPU datasheet and the "NVIDIA H100 Tensor Core GPU Architecture" whitepaper: 132 SMs;
# H200 datasheet: the H100's GH100 die with 141 GB; L4 datasheet: 58 SMs, 24 GB; GeForce RTX 4090: 128 SMs, 24 GB;
# V100 SXM2: 80 SMs; RTX 3090: 82 SMs). Per-capability limits (threads and shared memory per SM, the opt-in
# shared memory per block, registers per SM): the CUDA C++ Programming Guide's "Technical Specifications per
# Compute Capability" table. L2 sizes: the architecture whitepapers (V100 6 MB, A100 40 MB, H100/H200 SXM 50 MB,
# AD102 as in the RTX 4090 72 MB, AD104 as in the L4 48 MB, GA102 6 MB). Not read from a device.
_SM70 = dict(major=7, minor=0, max_threads_per_multi_processor=2048, shared_memory_per_block_optin=96 * KiB,
             shared_memory_per_multiprocessor=96 * KiB)
_SM80 = dict(major=8, minor=0, max_threads_per_multi_processor=2048, shared_memory_per_block_optin=163 * KiB,
             shared_memory_per_multiprocessor=164 * KiB)
_SM86 = dict(major=8, minor=6, max_threads_per_multi_processor=1536, shared_memory_per_block_optin=99 * KiB,
             shared_memory_per_multiprocessor=100 * KiB)
_SM89 = dict(_SM86, minor=9)
_SM90 = dict(major=9, minor=0, max_threads_per_multi_processor=2048, shared_memory_per_block_optin=227 * KiB,
             shared_memory_per_multiprocessor=228 * KiB)
#: The GPUs a lowering can target, by dtrlab.memory.device's preset names.
GPU_TARGETS = {
    "V100-16GB": GpuTarget("Tesla V100-SXM2-16GB", multi_processor_count=80, total_memory=16 * GiB,
                           L2_cache_size=6 * MiB, **_SM70),
    "V100-32GB": GpuTarget("Tesla V100-SXM2-32GB", multi_processor_count=80, total_memory=32 * GiB,
                           L2_cache_size=6 * MiB, **_SM70),
    "A100-40GB": GpuTarget("NVIDIA A100-SXM4-40GB", multi_processor_count=108, total_memory=40 * GiB,
                           L2_cache_size=40 * MiB, **_SM80),
    "A100-80GB": GpuTarget("NVIDIA A100-SXM4-80GB", multi_processor_count=108, total_memory=80 * GiB,
                           L2_cache_size=40 * MiB, **_SM80),
    "H100-80GB": GpuTarget("NVIDIA H100 80GB HBM3", multi_processor_count=132, total_memory=80 * GiB,
                           L2_cache_size=50 * MiB, **_SM90),
    "H200-141GB": GpuTarget("NVIDIA H200", multi_processor_count=132, total_memory=141 * GiB,
                            L2_cache_size=50 * MiB, **_SM90),
    "L4-24GB": GpuTarget("NVIDIA L4", multi_processor_count=58, total_memory=24 * GiB,
                         L2_cache_size=48 * MiB, **_SM89),
    "RTX3090-24GB": GpuTarget("NVIDIA GeForce RTX 3090", multi_processor_count=82, total_memory=24 * GiB,
                              L2_cache_size=6 * MiB, **_SM86),
    "RTX4090-24GB": GpuTarget("NVIDIA GeForce RTX 4090", multi_processor_count=128, total_memory=24 * GiB,
                              L2_cache_size=72 * MiB, **_SM89),
}


def gpu_target_named(name: str) -> GpuTarget:
    """The target ``name`` (a :data:`GPU_TARGETS` key), or a one-line ValueError naming it with a suggestion."""
    if name not in GPU_TARGETS:
        raise ValueError(f"unknown GPU {name!r}{did_you_mean(name, list(GPU_TARGETS))}; "
                         f"known GPUs: {', '.join(GPU_TARGETS)}")
    return GPU_TARGETS[name]


def matching_target(properties) -> str | None:
    """The :data:`GPU_TARGETS` name of a real device (``torch.cuda.get_device_properties``' answer): the one of its
    name, else the one of its capability, SM count and memory within 4 GiB (a device reports a little less than its
    nominal size); None when no target matches."""
    for name, target in GPU_TARGETS.items():
        if target.name == properties.name:
            return name
    for name, target in GPU_TARGETS.items():
        if ((target.major, target.minor, target.multi_processor_count) ==
                (properties.major, properties.minor, properties.multi_processor_count)
                and abs(target.total_memory - properties.total_memory) <= 4 * GiB):
            return name
    return None


def machine_gpu(source: str) -> str:
    """The :data:`GPU_TARGETS` name of this machine's GPU (device 0, :func:`matching_target`), the target of a step
    ``source`` put on CUDA itself (``model.cuda()``); a one-line ValueError where there is no GPU or no target
    matches it."""
    choose = f"name the GPU it trains on (--device, or device= in Python): {', '.join(GPU_TARGETS)}"
    if not torch.cuda.is_available():
        raise ValueError(f"{source} puts its step on CUDA and this machine has no GPU; {choose}")
    properties = torch.cuda.get_device_properties(0)
    name = matching_target(properties)
    if name is None:
        raise ValueError(f"{source} puts its step on CUDA, on a {properties.name} that no GPU target matches; {choose}")
    return name


def _no_op(*args, **kwargs) -> None:
    pass


def _cuda_answers(target: GpuTarget) -> dict:
    """``torch.cuda``'s functions as the target answers them (device 0, the only one)."""
    # A CUDA generator's state is its seed and its Philox offset, two int64s (torch/cuda/random.py:23,
    # get_rng_state's answer); what it holds does not matter: preserve_rng_state sets back what it got.
    rng_state = torch.zeros(16, dtype=torch.uint8)
    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "_lazy_init": _no_op,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": _no_op,
        "get_device_name": lambda device=None: target.name,
        "get_device_properties": lambda device=None: target,
        "get_device_capability": lambda device=None: (target.major, target.minor),
        "is_bf16_supported": lambda including_emulation=True: target.major >= 8,
        "get_rng_state": lambda device="cuda": rng_state.clone(),
        "set_rng_state": lambda new_state, device="cuda": None,
        "_exchange_device": lambda device: 0 if device >= 0 else -1,
        "_maybe_exchange_device": lambda device: 0 if device >= 0 else -1,
        "synchronize": _no_op,
    }


def _stream_answers() -> list[tuple[object, str, object]]:
    """The current stream's raw handle (the default stream, 0): a CUDA wrapper binds it at import
    (``from torch._C import _cuda_getCurrentRawStream as get_raw_stream``,
    torch/_inductor/codegen/cuda/device_op_overrides.py:20) and passes it to each kernel launch."""
    return [(torch._C, "_cuda_getCurrentRawStream", lambda device: 0)]


def _interface_answers(answers: dict) -> dict:
    """``CudaInterface``'s static methods bound to ``torch.cuda``'s functions at import (device_interface.py:252-265)."""
    return {"current_device": answers["current_device"], "set_device": answers["set_device"],
            "device_count": answers["device_count"], "get_device_properties": answers["get_device_properties"],
            "exchange_device": answers["_exchange_device"], "maybe_exchange_device": answers["_maybe_exchange_device"],
            "is_bf16_supported": answers["is_bf16_supported"], "synchronize": answers["synchronize"]}


def _clear_device_caches() -> None:
    """Forget device answers kept across calls, so that none leaks into or out of the block: every cached function
    of torch.utils._triton (``has_triton``, ``triton_backend``, ``triton_hash_with_backend``, the TMA checks: each a
    ``functools.cache``, torch/utils/_triton.py:36-275) and of torch._inductor.utils (``is_big_gpu``,
    ``get_max_num_sms``, ``get_gpu_type``, ``get_device_tflops``, ...), ``DeviceProperties.create``'s cache
    (hints.py:190) and the device interface Worker's property list and current device."""
    import torch.utils._triton
    from torch._dynamo import device_interface
    from torch._inductor import utils as inductor_utils
    from torch._inductor.runtime.hints import DeviceProperties

    for module in (torch.utils._triton, inductor_utils):
        for value in vars(module).values():
            if getattr(value, "__module__", None) == module.__name__ and hasattr(value, "cache_clear"):
                value.cache_clear()
    DeviceProperties.create.cache_clear()
    device_interface.caching_worker_device_properties.pop("cuda", None)
    device_interface.caching_worker_current_devices.pop("cuda", None)


def _triton_driver(target: GpuTarget):
    """Triton's active driver as the target's: its CUDA driver class (Inductor checks ``isinstance``,
    triton_helpers.py:78-82), never initialised (that loads its C utilities and asks the CUDA driver),
    answering the target (``CudaDriver.get_current_target``, triton/backends/nvidia/driver.py:367-372)."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver

    class TargetDriver(CudaDriver):
        def __init__(self):  # noqa: D107 - CudaDriver's own would load its C utilities
            self.target = GPUTarget("cuda", target.capability, target.warp_size)

        def get_current_target(self):
            return self.target

        def get_current_device(self) -> int:
            return 0

    return TargetDriver()


@contextlib.contextmanager
def _patched_attributes(patches: list[tuple[object, str, object]]) -> Iterator[None]:
    """Each ``(owner, name, value)`` set for the block, every original restored after it (in reverse order)."""
    originals = []
    try:
        for owner, name, value in patches:
            originals.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)


def patched_names(target: GpuTarget) -> list[tuple[object, str, object]]:
    """Every ``(owner, attribute, answer)`` :func:`gpu_target` sets (the test checks each is restored)."""
    from torch._dynamo.device_interface import CudaInterface
    from triton.runtime import driver

    answers = _cuda_answers(target)
    patches: list[tuple[object, str, object]] = [(torch.cuda, name, value) for name, value in answers.items()]
    patches += [(CudaInterface, name, staticmethod(value)) for name, value in _interface_answers(answers).items()]
    patches += [(CudaInterface.Worker, "current_device", staticmethod(answers["current_device"])),
                (CudaInterface.Worker, "get_device_properties", staticmethod(answers["get_device_properties"]))]
    patches += _stream_answers()
    patches.append((driver, "_active", _triton_driver(target)))
    return patches


def device_answers(gpu: str | None):
    """:func:`gpu_target` for a GPU's name, nothing for None (the CPU answers as itself)."""
    return contextlib.nullcontext() if gpu is None else gpu_target(gpu)


@contextlib.contextmanager
def gpu_target(name: str) -> Iterator[GpuTarget]:
    """Inductor's device queries answer as GPU ``name``'s (a :data:`GPU_TARGETS` key) inside the block."""
    target = gpu_target_named(name)
    patches = patched_names(target)
    _clear_device_caches()
    try:
        with _patched_attributes(patches):
            yield target
    finally:
        _clear_device_caches()
