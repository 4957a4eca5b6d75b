"""A step's joint graph as torch.compile would partition it on a GPU, traced on a machine without one.

API (through :func:`dtrlab.trace.torch_compile.tracing.trace_joint`)::

    joint = trace_joint("hf:gpt2", backend="inductor", gpu="H100-80GB")   # the step for an H100
    partition_lowered(joint, 0.5)                 # torch's partitioner, then CUDA Inductor's lowering

Why a re-trace: AOT autograd's joint trace on fake CUDA tensors stops without a GPU (the autograd
engine's CUDA device guard is C++ and asks for a primary context), and so does the dispatcher's
choice of an attention kernel (``_fused_sdp_choice`` reads the device's properties). So:

1. The step is traced on fake CPU tensors as today, with attention calling the kernel CUDA's
   dispatcher would pick (:func:`cuda_attention`, :func:`sdpa_backend`): its fake kernel runs on
   the CPU fake tensors, and AOT autograd records that kernel's backward. :data:`SWAPPED` names
   what changes (docs/compile.md's table names the same operators).
2. :func:`retrace_on_cuda` copies the joint graph, makes every device argument naming the CPU
   (``full(..., device=cpu)``) name ``cuda:0``, and computes each node's fake value again on fake
   CUDA tensors (``FakeTensorProp``, under the target's answers:
   :func:`dtrlab.trace.torch_compile.gpu_target.gpu_target`), so that shapes, strides and dtypes are CUDA's meta
   kernels' (an attention's log-sum-exp, a convolution's layout). Node names stay the CPU joint's.

The RNG: Inductor's decompositions turn dropout into ``inductor_seeds`` / ``inductor_random`` on every
device (its joint holds them on the CPU too); CUDA Inductor lowers them to Triton's Philox ``tl.rand``, and
CUDA's fused attention kernels take their dropout as a Philox seed and offset, outputs of the forward kernel
that its backward reads (the efficient kernel's ``philox_seed, philox_offset``; flash's ``rng_state``).

Not handled (one-line ValueError naming it): a graph holding a tensor constant a node reads (a ``get_attr``:
its real CPU value would need a CUDA twin; one nothing reads is dropped), a CPU-only operator left in the joint
(``_for_cpu``: a joint traced without :func:`cuda_attention`), a fused attention choice whose head size CUDA's
composite would pad first.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator

import torch
from torch import fx
from torch.nn import functional as F

from .gpu_target import GpuTarget, gpu_target, gpu_target_named

CUDA = torch.device("cuda", 0)


class CudaTraceError(ValueError):
    """A joint graph dtrlab cannot turn into its CUDA form (one line, naming the model and the cause)."""


#: The CPU joint's fused attention operators and what the CUDA joint holds in their place (flash's, the
#: memory-efficient kernel's or cuDNN's, as :func:`sdpa_backend` picks; docs/compile.md's table names each).
#: Where the CPU's fused kernel cannot run (dropout in training) its joint holds the math attention's generic
#: operators, which a fused kernel's pair replaces on CUDA.
SWAPPED = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (
        "aten._scaled_dot_product_flash_attention.default", "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_cudnn_attention.default"),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (
        "aten._scaled_dot_product_flash_attention_backward.default",
        "aten._scaled_dot_product_efficient_attention_backward.default",
        "aten._scaled_dot_product_cudnn_attention_backward.default"),
}

#: What else a CUDA joint holds where it runs a fused kernel (docs/compile.md's table): ``getitem`` of the kernels'
#: further outputs (the Philox seed and offset); copies where a CUDA kernel's outputs have other strides than the
#: CPU kernel's (``clone``: torchvision's ViT, the memory-efficient backward's gradients); on the memory-efficient
#: kernel, the mask expanded to (batch, heads, queries, keys) (``preprocess_mask``: a view, after a padded copy
#: when unaligned).
CUDA_ATTENTION_EXTRAS = frozenset({
    "<built-in function getitem>", "aten.clone.default", "aten.expand.default", "aten.constant_pad_nd.default",
    "aten.slice.Tensor"})
#: The math attention's operators as Inductor's decompositions leave them (``_scaled_dot_product_attention_math``:
#: scaling, ``bmm``, ``_safe_softmax``, dropout as ``inductor_random``, and their backward), which a CPU joint holds
#: where its fused kernel cannot run (dropout in training) and a CUDA joint replaces by a fused kernel's pair.
MATH_ATTENTION = frozenset({
    "aten.bmm.default", "aten.amax.default", "aten.exp.default", "aten.sum.dim_IntList", "aten.div.Tensor",
    "aten.sub.Tensor", "aten.mul.Tensor", "aten.mul.Scalar", "aten.add.Tensor", "aten.neg.default",
    "prims.fma.default", "aten.eq.Scalar", "aten.logical_not.default", "aten.any.dim", "aten.where.self",
    "aten.full.default", "prims.inductor_lookup_seed.default", "prims.inductor_random.default", "aten.gt.Scalar",
    "prims.convert_element_type.default", "aten.view.default", "aten.permute.default", "aten.clone.default",
    "aten.expand.default", "prims.iota.default", "aten.unsqueeze.default", "aten.le.Scalar",
    "aten.logical_and.default"})


def retrace_on_cuda(graph_module: fx.GraphModule, joint_inputs: tuple, cpu_mode, gpu: str,
                    source: str) -> tuple[fx.GraphModule, tuple, object]:
    """A copy of the joint graph ``graph_module`` with CUDA devices and fake values, its inputs as fake CUDA
    tensors, and their fake mode (module docstring, 2). ``cpu_mode``: the CPU trace's fake mode (its shape
    environment is shared), or None."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gpu_target_named(gpu)
    graph_module = copy.deepcopy(graph_module)
    _refuse_cpu_only(graph_module, source)
    _devices_to_cuda(graph_module)
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=getattr(cpu_mode, "shape_env", None))
    inputs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda value: _on_cuda(value, mode), joint_inputs)
    with gpu_target(gpu):
        FakeTensorProp(graph_module, mode).propagate_dont_convert_inputs(*torch.utils._pytree.tree_leaves(inputs))
    _tensor_metadata_again(graph_module)
    return graph_module, tuple(inputs), mode


def _on_cuda(value: torch.Tensor, mode) -> torch.Tensor:
    with mode:
        twin = torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device=CUDA)
    return twin.requires_grad_(value.requires_grad)


def _refuse_cpu_only(graph_module: fx.GraphModule, source: str) -> None:
    """Refuses what the re-trace cannot move to the GPU; drops a tensor constant nothing reads (T5's joint holds
    one, a 0-dimensional int64 left behind by its trace), which holds no memory in the step on either device."""
    for node in list(graph_module.graph.nodes):
        if node.op == "get_attr" and not node.users:
            graph_module.graph.erase_node(node)
            continue
        if node.op == "get_attr" and isinstance(getattr(graph_module, str(node.target), None), torch.Tensor):
            raise CudaTraceError(f"{source}: its joint graph holds a tensor constant ({node.target}), which the CUDA "
                                 "re-trace does not move to the GPU yet")
        if node.op == "call_function" and "_for_cpu" in str(node.target):
            raise CudaTraceError(f"{source}: its joint graph holds the CPU-only operator {node.target}: trace it "
                                 "under cuda_attention (trace_joint(..., gpu=...) does)")


def _devices_to_cuda(graph_module: fx.GraphModule) -> None:
    def moved(value):
        return CUDA if isinstance(value, torch.device) and value.type == "cpu" else value

    for node in graph_module.graph.nodes:
        node.args = fx.node.map_aggregate(node.args, moved)
        node.kwargs = fx.node.map_aggregate(node.kwargs, moved)
    graph_module.recompile()


def _tensor_metadata_again(graph_module: fx.GraphModule) -> None:
    """``tensor_meta`` (shapes, strides, dtypes, read by the partitioner) from the new fake values."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    for node in graph_module.graph.nodes:
        if "tensor_meta" in node.meta and isinstance(node.meta.get("val"), torch.Tensor):
            node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])


# ---- attention as CUDA's dispatcher picks it ----------------------------------------------------------------

def sdpa_backend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask, is_causal: bool,
                 target: GpuTarget, order: tuple[str, ...], dropout_p: float = 0.0,
                 runtime: tuple[int, bool] | None = None) -> str:
    """The attention kernel CUDA's dispatcher picks for these inputs on ``target``: "cudnn", "flash", "efficient"
    or "math". ``order``: the enabled kernels in the dispatcher's order (:func:`sdp_order`). ``runtime``: cuDNN's
    version and whether deterministic algorithms are enforced (:func:`sdp_runtime`, read now when None).

    Each kernel's conditions are those of aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (C++, not in
    the installed package; read in PyTorch's source at a revision whose rules match 2.14.1's docstring; the
    checks of its ``can_use_cudnn_attention``, ``can_use_flash_attention``, ``can_use_mem_efficient_attention``):

    * cuDNN: capability 8.0 to 12.1 (``check_cudnn_hardware_support``), float16 or bfloat16
      (``check_dtypes_low_precision``), a dropout that is a multiple of 1/16 (``check_cudnn_dropout``; none on
      cuDNN 9.11-9.13), head sizes multiples of 8 and at most 128, or 256 on capability 9.0 and 10.x with cuDNN
      above 9.22 (``check_cudnn_tensor_shapes``; with 256, a backward only for heads up to 128, 192/128 or 256/256,
      ``check_cudnn_d256_bprop_head_dim``), more than one key, not with deterministic algorithms
      (``check_cudnn_deterministic``); masks and grouped-query attention allowed;
    * flash: capability 8.0 or newer (``check_flash_attention_hardware_support``), float16 or bfloat16
      (``check_dtypes_flash_attention``), no attention mask (``check_for_attn_mask``), a head size of at most
      256, equal for query, key and value (``check_head_dim_size_flash``), a causal mask only on square
      attention (``check_flash_causal_non_square_seqlens``);
    * memory-efficient: capability 5.0 or newer, float32, float16 or bfloat16 (bfloat16 from 8.0), equal head
      sizes (``check_head_dim_size_mem_efficient``).

    Grouped-query attention runs on each fused kernel on NVIDIA CUDA, its key and value as they are
    (torch/nn/functional.py:6473-6475; ``check_batch_size_and_num_heads_dense<supports_gqa=true>``; their meta
    kernels take fewer key/value heads). Plain Python on shapes and dtypes: dynamo traces through it without a
    graph break.
    """
    head, head_value = query.shape[-1], value.shape[-1]
    same_heads = key.shape[-1] == head and head_value == head
    sixteen_bit = query.dtype in (torch.float16, torch.bfloat16)
    cudnn, deterministic = sdp_runtime() if runtime is None else runtime
    wide = (target.major, target.minor) == (9, 0) or target.major == 10
    cudnn_limit = 256 if wide and cudnn > 92200 else 128
    cudnn_backward = (cudnn_limit == 128 or (head <= 128 and head_value <= 128) or (head, head_value) in
                      ((192, 128), (256, 256)) or not any(t.requires_grad for t in (query, key, value)))
    usable = {
        "cudnn": (8 <= target.major <= 12 and sixteen_bit and cudnn >= 90000 and (dropout_p * 16).is_integer()
                  and not (dropout_p > 0 and 91100 < cudnn < 91400) and head <= cudnn_limit
                  and head_value <= cudnn_limit and head % 8 == 0 and head_value % 8 == 0 and cudnn_backward
                  and key.shape[-2] != 1 and not (dropout_p > 0 and query.shape[-2] == 1) and not deterministic),
        "flash": (target.major >= 8 and sixteen_bit and attn_mask is None
                  and same_heads and head <= 256 and not (is_causal and query.shape[-2] != key.shape[-2])),
        "efficient": (target.major >= 5 and query.dtype in (torch.float32, torch.float16, torch.bfloat16)
                      and (query.dtype != torch.bfloat16 or target.major >= 8) and same_heads),
        "math": True,
    }
    return next((name for name in order if usable.get(name)), "math")


def sdp_runtime() -> tuple[int, bool]:
    """cuDNN's version as torch reports it (0 without cuDNN), and whether deterministic algorithms are enforced
    (not only warned about), which rules cuDNN attention out."""
    enforced = torch.are_deterministic_algorithms_enabled()
    return torch.backends.cudnn.version() or 0, enforced and not torch.is_deterministic_algorithms_warn_only_enabled()


def sdp_order(target: GpuTarget | None = None) -> tuple[str, ...]:
    """The attention kernels enabled now, in the dispatcher's order; disabled ones left out
    (torch/backends/cuda/__init__.py ``flash_sdp_enabled``, ``mem_efficient_sdp_enabled``, ``math_sdp_enabled``,
    ``cudnn_sdp_enabled``). The order is ``torch._C._get_sdp_priority_order()``, read as
    torch/nn/attention/__init__.py reads it (flash, memory-efficient, math, cuDNN by default), except on a
    ``target`` where the dispatcher puts cuDNN first at its first call: capability 9.x or 10.x with a cuDNN above
    9.15 (9.24 comes with torch 2.14.1+cu130), unless ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` is set
    (sdp_utils.cpp's ``check_prefer_cudnn_attention``, ``priority_order``; below CUDA 13, capability 9.0, 9.3,
    10.0 and 10.3 only)."""
    from torch._C import _SDPBackend

    enabled = {int(_SDPBackend.FLASH_ATTENTION): ("flash", torch.backends.cuda.flash_sdp_enabled()),
               int(_SDPBackend.EFFICIENT_ATTENTION): ("efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
               int(_SDPBackend.MATH): ("math", torch.backends.cuda.math_sdp_enabled()),
               int(_SDPBackend.CUDNN_ATTENTION): ("cudnn", torch.backends.cuda.cudnn_sdp_enabled())}
    order = [int(backend) for backend in torch._C._get_sdp_priority_order()]
    if target is not None and _prefers_cudnn(target):
        order = [int(_SDPBackend.CUDNN_ATTENTION), int(_SDPBackend.FLASH_ATTENTION),
                 int(_SDPBackend.EFFICIENT_ATTENTION), int(_SDPBackend.MATH)]
    return tuple(enabled[backend][0] for backend in order if enabled.get(backend, ("", False))[1])


def _prefers_cudnn(target: GpuTarget) -> bool:
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").lower() in ("1", "true", "on", "yes"):
        return False
    minors_ok = int((torch.version.cuda or "0").split(".")[0]) >= 13 or target.minor in (0, 3)
    return sdp_runtime()[0] > 91500 and target.major in (9, 10) and minors_ok


# The mask as the composite ``scaled_dot_product_attention`` (aten/src/ATen/native/transformers/attention.cpp; C++,
# not in the installed package, read in PyTorch's source at a revision with ``enable_gqa``, not 2.14.1's own) hands
# it to the kernel it picked: each of its cases but cuDNN's first converts a boolean mask into an additive one
# (``convert_boolean_attn_mask``), and its memory-efficient case then pads and expands it (``preprocess_mask``).
def additive_mask(attn_mask, dtype: torch.dtype):
    """``convert_boolean_attn_mask``: a boolean mask becomes a new tensor of ``dtype``, 0 where it is True and
    minus infinity where False, in the form the installed torch's CPU joint holds it (a ``where`` between two
    0-dimensional tensors); an additive mask (or None) is passed through."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    zero, minus_infinity = (torch.scalar_tensor(value, dtype=dtype, device=attn_mask.device)
                            for value in (0.0, float("-inf")))
    return torch.where(attn_mask, zero, minus_infinity)


def efficient_mask(attn_mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``preprocess_mask``: a mask whose strides (all but the last) are not multiples of 8 elements, or whose last
    stride is not 1, is copied into a buffer padded to the next multiple of 8 in its last dimension (``pad_bias``)
    and sliced back; then it is expanded to (batch, heads, queries, keys), a view."""
    alignment = 8
    aligned = attn_mask.stride(-1) == 1 and all(stride % alignment == 0 for stride in attn_mask.stride()[:-1])
    if not aligned:
        length = attn_mask.shape[-1]
        attn_mask = F.pad(attn_mask, (0, alignment - length % alignment))[..., :length]
    return attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


@contextlib.contextmanager
def cuda_attention(gpu: str) -> Iterator[None]:
    """``F.scaled_dot_product_attention`` runs the kernel :func:`sdpa_backend` picks for ``gpu`` (on whatever
    fake tensors it is given), for the duration of the block."""
    target = gpu_target_named(gpu)
    order, runtime = sdp_order(target), sdp_runtime()  # read here: dynamo would break its graph on them
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if torch.is_autocast_enabled(query.device.type):
            # Autocast casts scaled_dot_product_attention's floating inputs to its dtype on CUDA as on the CPU
            # (aten/src/ATen/autocast_mode.cpp: KERNEL_CUDA(scaled_dot_product_attention, lower_precision_fp)),
            # before the dispatcher picks a kernel; the kernels called here are not on its lists, so cast first.
            low = torch.get_autocast_dtype(query.device.type)
            query, key, value, attn_mask = (
                tensor.to(low) if tensor is not None and tensor.is_floating_point() and tensor.dtype != torch.float64
                else tensor for tensor in (query, key, value, attn_mask))
        backend = sdpa_backend(query, key, value, attn_mask, is_causal, target, order, dropout_p, runtime)
        attn_mask = additive_mask(attn_mask, query.dtype)
        if backend == "math":
            return torch.ops.aten._scaled_dot_product_attention_math(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
        if query.shape[-1] % 8:
            raise CudaTraceError(f"attention with head size {query.shape[-1]}: CUDA's composite pads it to a "
                                 "multiple of 8 before its fused kernel, which dtrlab does not model")
        # Each fused kernel takes grouped-query attention's fewer key/value heads as they are.
        if backend == "cudnn":  # the mask as converted, not padded or expanded (attention.cpp's cuDNN case)
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, True, dropout_p, is_causal, False, scale=scale)[0]
        if backend == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if attn_mask is not None:
            attn_mask = efficient_mask(attn_mask, query, key)
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale)[0]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
