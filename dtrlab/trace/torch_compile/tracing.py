"""A training step traced once into the joint graph torch.compile would partition; fake copies of a live model.

:func:`trace_joint` builds the model source (any ``dtrlab capture`` source: zoo, ``torchvision:``, ``hf:``,
``diffusers:``, ``module:function``) under a ``FakeTensorMode`` on the CPU device: no weights, no data, no memory.
The training step (``loss_fn(model(*inputs))``, :class:`LossStep`) goes through ``torch.compile(fullgraph=True)``
with an ``aot_autograd`` backend whose partition function keeps the joint forward+backward graph AOT autograd hands
it (and its arguments) and stops the compile there (:mod:`dtrlab.trace.torch_compile.intercept`): the joint graph
is exactly what torch.compile partitions, traced once. A step with graph breaks is run by torch.compile on the fake
tensors instead, every graph's joint kept with the tensors each graph call took and gave (``JointGraph.parts``,
:class:`~dtrlab.trace.torch_compile.joint.StepLinks`; :mod:`dtrlab.trace.torch_compile.graph_breaks`);
:func:`~dtrlab.trace.torch_compile.partition.partition` partitions each graph on its own, as torch.compile does,
and records the whole step (:func:`~dtrlab.trace.torch_compile.record.run_parts`). With ``gpu``, the step is
re-traced for that GPU (:func:`for_gpu`, :mod:`dtrlab.trace.torch_compile.cuda_joint`).

Bad input (a model dynamo cannot trace, an unknown backend, a torch without the knob) raises ``ValueError``
with one line naming it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Iterator

import torch
from torch import nn

from .cuda_joint import cuda_attention, retrace_on_cuda
from .gpu_target import machine_gpu
from .graph_breaks import _graph_parts
from .intercept import _one_graph
from .joint import JointGraph, _forward_nodes, _joint_graph, check_backend, check_torch_has_knob


def trace_joint(source: str, *, batch: int | None = None, seq: int | None = None, image: int = 224,
                dtype: torch.dtype | None = None, autocast: torch.dtype | None = None, device: str = "cpu",
                backend: str = "aot_eager", gpu: str | None = None,
                **sizes) -> JointGraph:
    """Trace ``source``'s training step once into the joint graph torch.compile would partition.

    Build options are :func:`dtrlab.trace.models.build`'s (``dtype``, ``autocast`` among them). ``device``: the device the fake
    tensors claim ("cpu"; "cuda" traces the kernels a GPU step picks, e.g. its flash
    attention, with no GPU needed). ``backend``: whose joint graph
    (:data:`~dtrlab.trace.torch_compile.joint.BACKENDS`):
    ``"inductor"`` runs ``torch.compile(backend="inductor")`` up to its partition function
    (``torch/_inductor/compile_fx.py:2466``, ``partition_fn``: Inductor's decompositions, then
    its joint-graph passes at :2484, then ``min_cut_rematerialization_partition(...,
    compiler="inductor")`` at :2506) and keeps the graph it hands the partitioner.
    ``gpu``: a :data:`~dtrlab.trace.torch_compile.gpu_target.GPU_TARGETS` name: the step as torch.compile traces it for
    that GPU, without one (:mod:`dtrlab.trace.torch_compile.cuda_joint`: traced on the CPU with CUDA's attention
    kernels, then re-traced on fake CUDA tensors); partitioned and lowered under the GPU's answers. A
    ``module:function`` source that puts its step on CUDA itself (``model.cuda()``) is built on the CPU and takes
    this machine's GPU when ``gpu`` is None (:func:`~dtrlab.trace.torch_compile.gpu_target.machine_gpu`).
    Raises ``ValueError`` (one line) for an unknown source or backend or a step dynamo cannot
    capture (graph breaks are followed under aot_eager: see ``parts``).
    """
    from ..models import fake_workload

    check_torch_has_knob()
    options = {"batch": batch, "seq": seq, "image": image, "dtype": dtype, "autocast": autocast, **sizes}
    with fake_workload(source, device=device, **options) as workload:
        pass  # dynamo makes its own fake tensors from these: the step is compiled outside this mode
    if workload.built_for_cuda and gpu is None:  # its function put the step on CUDA (built on the CPU here)
        gpu = machine_gpu(source)
    named = {**options, "device": device, "gpu": gpu}
    build_options = tuple(sorted((k, _option_value(v)) for k, v in named.items() if v is not None))
    return trace_step(workload.module, workload.inputs, workload.loss_fn, source=source,
                      build_options=build_options, desc=workload.desc, backend=backend, gpu=gpu)


def trace_step(module: nn.Module, inputs, loss_fn=None, *, source: str, build_options: tuple = (),
               desc: str = "", backend: str = "aot_eager", gpu: str | None = None) -> JointGraph:
    """The joint graph of ``loss_fn(module(*inputs))`` (``loss_fn`` None: the sum of every output that
    requires grad), as torch.compile would partition it: :func:`trace_joint`'s work once the model is
    built. ``module`` and ``inputs`` should be fake tensors (:func:`fake_module`, or built under a
    ``FakeTensorMode``): dynamo fakes real ones itself, but the caller then holds their memory.
    A step dynamo cannot capture in one graph is followed through its graph breaks (``parts``: each graph's
    joint, under ``backend="inductor"`` the one Inductor partitions). ``backend`` and ``gpu``: :func:`trace_joint`'s
    (with ``gpu``, ``module`` and ``inputs`` on the CPU).
    Raises :class:`~dtrlab.trace.models.ModelSourceError` (a ValueError, one line) for a step dynamo
    cannot capture at all or one that does not return one scalar."""
    from ..models import ModelSourceError

    check_torch_has_knob()
    check_backend(backend)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    step = LossStep(module, loss_fn)
    with contextlib.nullcontext() if gpu is None else cuda_attention(gpu):
        kept = _one_graph(step, inputs, source, backend)
        # graph breaks: each graph partitioned on its own, as torch.compile does
        joint = _graph_parts(step, inputs, source, build_options, desc, backend) if kept is None else None
    if joint is None:
        graph_module = kept["graph_module"]
        tangents = [node for node in graph_module.graph.find_nodes(op="placeholder")
                    if node.name.startswith("tangents")]
        if len(tangents) != 1 or tangents[0].meta["val"].dim() != 0:
            raise ModelSourceError(f"{source}: its joint graph has {len(tangents)} tangents; the step must return "
                                   "one scalar loss")
        joint = _joint_graph(source, build_options, kept, desc, backend)
    return joint if gpu is None else for_gpu(joint, gpu)


class LossStep(nn.Module):  # pragma: no mutate block (dynamo traces forward: mutmut's trampoline would break it)
    """The model and its loss as one module: the step torch.compile traces returns the loss."""

    def __init__(self, module: nn.Module, loss_fn):
        super().__init__()
        self.module = module
        self.loss_fn = loss_fn

    def forward(self, *inputs):
        output = self.module(*inputs)
        if self.loss_fn is None:
            return sum(t.sum() for t in torch.utils._pytree.tree_leaves(output)
                       if isinstance(t, torch.Tensor) and t.requires_grad)
        return self.loss_fn(output)


def gpu_of(device, source: str) -> str | None:
    """The GPU target a step on ``device`` is lowered for: this machine's GPU (:func:`machine_gpu`) for a CUDA
    device, None (the CPU's lowering) for any other."""
    return machine_gpu(source) if torch.device(device).type == "cuda" else None


def _option_value(value):
    return str(value) if isinstance(value, torch.dtype) else value


def for_gpu(joint: JointGraph, gpu: str) -> JointGraph:
    """``joint`` re-traced on fake CUDA tensors for GPU ``gpu``
    (:func:`dtrlab.trace.torch_compile.cuda_joint.retrace_on_cuda`), each graph of a step with graph breaks on its own.
    Node names stay ``joint``'s."""
    if not joint.parts:
        return _graph_for_gpu(joint, gpu)
    parts = tuple(_graph_for_gpu(part, gpu) for part in joint.parts)
    return dataclasses.replace(joint, graph_module=parts[0].graph_module, joint_inputs=parts[0].joint_inputs,
                               parts=parts, gpu=gpu, **_fresh_memos())


def _graph_for_gpu(joint: JointGraph, gpu: str) -> JointGraph:
    capture = joint.inductor
    graph_module, inputs, mode = retrace_on_cuda(joint.graph_module, joint.joint_inputs,
                                                 capture.fake_mode if capture else None, gpu, joint.source)
    if capture is not None:  # Inductor takes its fake mode from the tracing context (torch/_guards.py, detect_fake_mode)
        context = copy.copy(capture.tracing_context)
        context.fake_mode = mode
        capture = dataclasses.replace(capture, tracing_context=context, fake_mode=mode)
    return dataclasses.replace(joint, graph_module=graph_module, joint_inputs=inputs,
                               forward_nodes=_forward_nodes(graph_module.graph), inductor=capture, gpu=gpu,
                               **_fresh_memos())


def _fresh_memos() -> dict:
    """What a JointGraph remembers of its partitions and lowerings, empty for a new graph (``replace`` would share
    the old graph's)."""
    return dict(runtime_estimates={}, min_cuts={}, lowerings={}, lowered_records={})


def meta_module(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device (no memory, no values):
    ``copy.deepcopy`` with each tensor's meta twin in its memo, so the live module is neither copied nor
    touched (hooks, training mode and attributes come along)."""
    memo: dict = {}
    for name, tensor in [*module.named_parameters(remove_duplicate=True), *module.named_buffers()]:
        if id(tensor) in memo:
            continue
        # from its sizes, not the tensor: a fake tensor's (a model dynamo or a test faked) twin is a real meta one
        twin = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device="meta")
        memo[id(tensor)] = nn.Parameter(twin, requires_grad=tensor.requires_grad) \
            if isinstance(tensor, nn.Parameter) else twin
    return copy.deepcopy(module, memo)


@contextlib.contextmanager
def closure_on(function, device) -> Iterator[None]:
    """The tensors ``function`` reads from its closure or its module's globals (a loss's labels) replaced by empty
    twins on ``device`` (made from their sizes, as :func:`meta_module`'s) while the context runs, then restored:
    a step run on a :func:`meta_module` or :func:`fake_module` copy must not meet the live tensors a loss refers to
    on another device. Tensors inside containers, or reached through other functions, are not."""
    device = torch.device(device)

    def elsewhere(value) -> bool:
        return isinstance(value, torch.Tensor) and value.device != device

    slots = [(functools.partial(setattr, cell, "cell_contents"), cell.cell_contents)
             for cell in getattr(function, "__closure__", None) or () if elsewhere(cell.cell_contents)]
    code, namespace = getattr(function, "__code__", None), getattr(function, "__globals__", {})
    slots += [(functools.partial(namespace.__setitem__, name), namespace[name])
              for name in (code.co_names if code else ()) if elsewhere(namespace.get(name))]
    for write, tensor in slots:
        write(torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device=device)
              .requires_grad_(tensor.requires_grad))
    try:
        yield
    finally:
        for write, tensor in slots:
            write(tensor)


def fake_module(module: nn.Module, inputs, device: str | torch.device) -> tuple[nn.Module, tuple]:
    """``module`` and ``inputs`` as fake tensors on ``device`` (any device, no GPU needed; values never
    matter to the partitioner): the live model is not copied, its parameters are not touched."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    twin = meta_module(module)
    with FakeTensorMode(allow_non_fake_inputs=True):
        twin.to_empty(device=device)
        fake_inputs = torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda t: torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype,
                                                        device=device).requires_grad_(t.requires_grad), inputs)
    return twin, fake_inputs
