"""A step's joint graph as torch.compile would partition it on a GPU, traced on a machine without one.

API::

    joint = trace_joint("hf:gpt2", backend="inductor")      # the CPU's joint (fake CPU tensors)
    on_gpu = cuda_joint(joint, "H100-80GB")                   # the same step for an H100
    partition_lowered(on_gpu, 0.5)                            # partitioned, then lowered by CUDA Inductor

Why a re-trace: AOT autograd's joint trace on fake CUDA tensors stops without a GPU (the autograd
engine's CUDA device guard is C++ and asks for a primary context), and so does the dispatcher's
choice of an attention kernel (``_fused_sdp_choice`` reads the device's properties). So the step
is traced on fake CPU tensors as today, and :func:`cuda_joint` turns that joint into the CUDA one:

1. Operators the CPU's dispatcher picked that CUDA's would not are swapped for CUDA's choice
   (:data:`SWAPPED`, named in docs/compile.md's table): attention's fused kernels by
   :func:`sdpa_backend`'s rules.
2. Every device argument naming the CPU (``full(..., device=cpu)``) names ``cuda:0``.
3. Each node's fake value is computed again on fake CUDA tensors (``FakeTensorProp``, with the
   target's answers: :func:`dtrlab.trace.gpu_target.gpu_target`), so that shapes, strides and
   dtypes are what CUDA's meta kernels give (an attention's log-sum-exp, a convolution's layout).

The result is a :class:`~dtrlab.trace.partition.JointGraph` with ``gpu`` set: torch's partitioner and
Inductor's lowering then run on it under the target's answers (:func:`~dtrlab.trace.partition.partition`).
Node names are the CPU joint's, so a forcing names the same nodes. What Inductor held for the CPU compile
(its tracing context, AOT autograd's metadata, the dynamo graph) is reused, with the CUDA fake mode.

Not handled (one-line ValueError naming it): a graph holding a tensor constant (a ``get_attr``: its real
CPU value would need a CUDA twin), attention that only CUDA's math kernel could run.
"""

from __future__ import annotations

import copy
import dataclasses
import operator

import torch
from torch import fx

from .gpu_target import GpuTarget, gpu_target, gpu_target_named
from .partition import InductorCapture, JointGraph, _forward_nodes

CUDA = torch.device("cuda", 0)


class CudaTraceError(ValueError):
    """A joint graph dtrlab cannot turn into its CUDA form (one line, naming the graph and the cause)."""


def cuda_joint(joint: JointGraph, gpu: str) -> JointGraph:
    """``joint`` (traced on the CPU) as torch.compile would trace it for GPU ``gpu`` (module docstring)."""
    target = gpu_target_named(gpu)
    if joint.gpu is not None:
        raise ValueError(f"{joint.source}: the joint graph is {joint.gpu}'s already")
    if not joint.parts:
        return _part_for_gpu(joint, gpu, target)
    parts = tuple(_part_for_gpu(part, gpu, target) for part in joint.parts)
    first = parts[0]
    return dataclasses.replace(
        joint, build_options=_with_gpu(joint.build_options, gpu), graph_module=first.graph_module,
        joint_inputs=first.joint_inputs, parts=parts, gpu=gpu, **_fresh_memos())


def _fresh_memos() -> dict:
    """What a JointGraph remembers of partitions and lowerings: empty for a new graph (``replace`` would share them)."""
    return dict(runtime_estimates={}, min_cuts={}, lowerings={}, lowered_records={})


def _with_gpu(build_options: tuple, gpu: str) -> tuple:
    return tuple(sorted((*build_options, ("gpu", gpu))))


def _part_for_gpu(joint: JointGraph, gpu: str, target: GpuTarget) -> JointGraph:
    """One graph's joint for the GPU: swaps, devices, fake values again (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    graph_module = copy.deepcopy(joint.graph_module)
    _refuse_constants(graph_module, joint.source)
    _swap_operators(graph_module, target, joint.source)
    _devices_to_cuda(graph_module)
    cpu_mode = joint.inductor.fake_mode if joint.inductor is not None else None
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=getattr(cpu_mode, "shape_env", None))
    inputs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda value: _on_cuda(value, mode),
                                               joint.joint_inputs)
    with gpu_target(gpu):
        FakeTensorProp(graph_module, mode).propagate_dont_convert_inputs(*torch.utils._pytree.tree_leaves(inputs))
    _tensor_metadata_again(graph_module)
    return dataclasses.replace(
        joint, build_options=_with_gpu(joint.build_options, gpu), graph_module=graph_module,
        joint_inputs=tuple(inputs), forward_nodes=_forward_nodes(graph_module.graph),
        inductor=_capture_for(joint.inductor, mode), gpu=gpu, **_fresh_memos())


def _on_cuda(value: torch.Tensor, mode) -> torch.Tensor:
    with mode:
        twin = torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device=CUDA)
    return twin.requires_grad_(value.requires_grad)


def _capture_for(capture: InductorCapture | None, mode) -> InductorCapture | None:
    """Inductor's capture with the CUDA fake mode in its tracing context (Inductor takes its fake mode from there:
    torch/_guards.py, ``detect_fake_mode``)."""
    if capture is None:
        return None
    context = copy.copy(capture.tracing_context)
    context.fake_mode = mode
    return dataclasses.replace(capture, tracing_context=context, fake_mode=mode)


def _refuse_constants(graph_module: fx.GraphModule, source: str) -> None:
    for node in graph_module.graph.find_nodes(op="get_attr"):
        if isinstance(getattr(graph_module, str(node.target), None), torch.Tensor):
            raise CudaTraceError(f"{source}: its joint graph holds a tensor constant ({node.target}), which the CUDA "
                                 "re-trace does not move to the GPU yet")


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


# ---- operators the CUDA dispatcher picks differently ----------------------------------------------------------

aten = torch.ops.aten
CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
#: Every CPU operator :func:`cuda_joint` swaps, and what replaces it (docs/compile.md's table says the same).
SWAPPED = {
    "aten._scaled_dot_product_flash_attention_for_cpu": "aten._scaled_dot_product_flash_attention or "
    "aten._scaled_dot_product_efficient_attention (sdpa_backend)",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": "the chosen kernel's backward, given the "
    "forward's Philox seed and offset",
}


def sdpa_backend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask, dropout_p: float,
                 is_causal: bool, target: GpuTarget) -> str:
    """The fused attention kernel CUDA's dispatcher picks for these inputs on ``target``: "flash",
    "efficient" or "math".

    The order is the dispatcher's own (``torch._C._get_sdp_priority_order()``, read as
    torch/nn/attention/__init__.py:92 reads it: flash, memory-efficient, math, cuDNN by default, so cuDNN
    is never reached while math is enabled); each kernel is skipped when disabled
    (torch/backends/cuda/__init__.py:510 ``flash_sdp_enabled``, :528 ``mem_efficient_sdp_enabled``).
    Each kernel's conditions are those of aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (C++, not
    in the installed package; its ``use_flash_attention`` and ``use_mem_efficient_attention`` checks):

    * flash: capability 8.0 or newer (``check_sm_version``), float16 or bfloat16
      (``check_dtypes_low_precision``), no attention mask (``check_for_attn_mask``), head size at most 256
      and equal for query, key and value (``check_head_dim_size_flash``), a causal mask only on square
      attention (``check_flash_causal_non_square_seqlens``);
    * memory-efficient: capability 5.0 or newer, float32, float16 or bfloat16 (bfloat16 from 8.0), a head
      size that is a multiple of 8 for query, key and value (``check_head_dim_size_mem_efficient``; the
      composite pads other sizes first, not modelled: refused).
    """
    from torch._C import _SDPBackend

    head = query.shape[-1]
    same_heads = key.shape[-1] == head and value.shape[-1] == head
    bf16_ok = query.dtype != torch.bfloat16 or target.major >= 8
    flash = (target.major >= 8 and query.dtype in (torch.float16, torch.bfloat16) and attn_mask is None
             and same_heads and head <= 256 and not (is_causal and query.shape[-2] != key.shape[-2]))
    efficient = (target.major >= 5 and query.dtype in (torch.float32, torch.float16, torch.bfloat16) and bf16_ok
                 and same_heads and head % 8 == 0)
    usable = {int(_SDPBackend.FLASH_ATTENTION): ("flash", flash and torch.backends.cuda.flash_sdp_enabled()),
              int(_SDPBackend.EFFICIENT_ATTENTION): ("efficient",
                                                     efficient and torch.backends.cuda.mem_efficient_sdp_enabled()),
              int(_SDPBackend.MATH): ("math", torch.backends.cuda.math_sdp_enabled())}
    for backend in torch._C._get_sdp_priority_order():
        name, ok = usable.get(int(backend), ("", False))
        if ok:
            return name
    return "math"


def _swap_operators(graph_module: fx.GraphModule, target: GpuTarget, source: str) -> None:
    """Every CPU attention kernel (and its backward) replaced by the one CUDA's dispatcher picks."""
    graph = graph_module.graph
    for forward in list(graph.find_nodes(op="call_function", target=CPU_FLASH)):
        query, key, value = (arg.meta["val"] for arg in forward.args[:3])
        dropout_p, is_causal = _flash_options(forward)
        attn_mask = forward.kwargs.get("attn_mask")
        backend = sdpa_backend(query, key, value, attn_mask, dropout_p, is_causal, target)
        if backend == "math":
            raise CudaTraceError(f"{source}: CUDA would run {forward.name}'s attention with its math kernel, which "
                                 "the CUDA re-trace does not decompose yet")
        backwards = [user for output in forward.users for user in output.users if user.target is CPU_FLASH_BACKWARD]
        swap = _swap_flash if backend == "flash" else _swap_efficient
        swap(graph, forward, backwards)
    graph.lint()
    graph_module.recompile()


def _flash_options(node: fx.Node) -> tuple[float, bool]:
    dropout_p = node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)
    is_causal = node.args[4] if len(node.args) > 4 else node.kwargs.get("is_causal", False)
    return float(dropout_p), bool(is_causal)


def _outputs(graph: fx.Graph, node: fx.Node, indices: range) -> list[fx.Node]:
    """``getitem`` nodes for ``node``'s outputs ``indices``: its existing ones, new ones after it."""
    existing = {user.args[1]: user for user in node.users if user.target is operator.getitem}
    made = []
    with graph.inserting_after(node):
        for index in reversed(indices):
            made.append(existing.get(index) or graph.call_function(operator.getitem, (node, index)))
    return made[::-1]


def _swap_efficient(graph: fx.Graph, forward: fx.Node, backwards: list[fx.Node]) -> None:
    """``_scaled_dot_product_efficient_attention``: its (output, logsumexp, philox seed, philox offset); the
    backward takes the seed and offset (CUDA's Philox form of the dropout's RNG) and a gradient mask."""
    query, key, value = forward.args[:3]
    dropout_p, is_causal = _flash_options(forward)
    attn_mask, scale = forward.kwargs.get("attn_mask"), forward.kwargs.get("scale")
    forward.target = aten._scaled_dot_product_efficient_attention.default
    forward.args, forward.kwargs = (query, key, value, attn_mask, True, dropout_p, is_causal), {"scale": scale}
    _, _, seed, offset = _outputs(graph, forward, range(4))
    for backward in backwards:
        grad_out, query, key, value, out, lse = backward.args[:6]
        needs_bias_grad = False  # the mask is a constant of the step: the CPU kernel gives it no gradient either
        backward.target = aten._scaled_dot_product_efficient_attention_backward.default
        backward.args = (grad_out, query, key, value, attn_mask, out, lse, seed, offset, dropout_p,
                         [True, True, True, needs_bias_grad], is_causal)
        backward.kwargs = {"scale": scale}


def _swap_flash(graph: fx.Graph, forward: fx.Node, backwards: list[fx.Node]) -> None:
    """``_scaled_dot_product_flash_attention``: outputs (output, logsumexp, cumulative sequence lengths, maximum
    lengths, Philox state ``rng_state`` and ``unused``, debug mask); its backward takes all but the mask."""
    query, key, value = forward.args[:3]
    dropout_p, is_causal = _flash_options(forward)
    scale = forward.kwargs.get("scale")
    forward.target = aten._scaled_dot_product_flash_attention.default
    forward.args, forward.kwargs = (query, key, value, dropout_p, is_causal, False), {"scale": scale}
    _, _, cum_q, cum_k, max_q, max_k, seed, offset = _outputs(graph, forward, range(8))
    for backward in backwards:
        grad_out, query, key, value, out, lse = backward.args[:6]
        backward.target = aten._scaled_dot_product_flash_attention_backward.default
        backward.args = (grad_out, query, key, value, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal,
                         seed, offset)
        backward.kwargs = {"scale": scale}
