"""torch.compile's activation-memory knob, called rather than re-implemented: trace once, partition per knob.

``torch._functorch.config.activation_memory_budget`` (a ratio in [0, 1], default 1.0) steers
torch.compile's min-cut partitioner (``min_cut_rematerialization_partition``): below 1 it
runs a knapsack (``activation_memory_budget_solver``, "dp" by default) over the activations
it would otherwise save, weighing their bytes against the recompute cost its
``activation_memory_budget_runtime_estimator`` ("flops") assigns. This module asks torch's
own partitioner what it decides for each knob value and turns the answer into a dtrlab
:class:`~dtrlab.trace.model.Trace`.

API (stable; dtrlab.memory.partitioned and the knob census build on it)::

    joint = trace_joint("hf:llama", batch=1, seq=256, layers=4)   # once: dynamo + AOT autograd
    step = partition(joint, 0.05)                                  # per knob: torch's partitioner
    step.saved, step.recomputed, step.proxy_saved_bytes, step.trace
    partition(joint, 0.05, force={"mm_3": "recompute"})            # one node forced (its hooks)

    # dtrlab.memory.partitioned (the memory layer):
    knob_peaks(joint, 0.05)     # {knob, flat_peak, allocated_peak, reserved_peak, proxy_saved_bytes, ...}
    peak_composition(step)      # what is live at the peak: constants, saved, recomputed, backward
    interventions(joint, 0.05)  # one row per node forced saved / recomputed: its peak delta

* :func:`trace_joint` builds the model source (any ``dtrlab capture`` source: zoo,
  ``torchvision:``, ``hf:``, ``diffusers:``, ``module:function``) under a
  ``FakeTensorMode`` on the CPU device: no weights, no data, no memory. The training step
  (``loss_fn(model(*inputs))``) goes through ``torch.compile(fullgraph=True)`` with an
  ``aot_autograd`` backend whose partition function keeps the joint forward+backward graph
  AOT autograd hands it (and its arguments) and stops the compile there: the joint graph
  is exactly what torch.compile partitions, traced once. A step with graph breaks is run
  by torch.compile on the fake tensors instead, every graph's joint kept with the tensors
  each graph call took and gave (``JointGraph.parts``, :class:`StepLinks`); :func:`partition`
  partitions each graph on its own, as torch.compile does, and records the whole step
  (:func:`run_parts`).
* :func:`partition` copies that joint graph and calls torch's
  ``min_cut_rematerialization_partition`` on the copy with the knob patched into
  ``torch._functorch.config`` (and the solver, optionally): no recompile. The forward and
  backward graphs it returns are run in order on meta tensors under the capture's recorder
  (:class:`dtrlab.trace.capture.Recorder`, the code that records ``dtrlab capture``'s logs:
  same operator names, sizes, aliasing, release points and cost models), run as aot_eager
  runs them (boxed calls: each graph frees its inputs and intermediates after their last
  use); saved tensors are handed from the forward's outputs to the backward, so a saved view
  keeps its base's storage, as in the real step. The result is a :class:`PartitionedStep`.

What the trace is: the forward graph's operators, then the backward graph's (the
recomputed forward operators among them, where the partitioner put them). Constants: the
forward graph's inputs (parameters, buffers, inputs and the tensors dynamo lifted, such as
the loss's targets) and the backward's tangent (the loss's gradient, a scalar); they live
through the whole step. The forward's outputs other than the loss are the saved tensors:
each lives until its last use in the backward. The backward's outputs (the gradients) live
to the end of the step. Not modelled here: Inductor's lowering (fusion, reordering and
buffer reuse: the graphs run node by node, as aot_eager runs them; dtrlab.trace.torch_compile.inductor
lowers them as Inductor does), the optimizer step, and autograd's own small tensors
outside the graphs.

Bad input (a model dynamo cannot trace, a knob outside [0, 1], a torch
without the knob, an unknown solver or node) raises ``ValueError`` with one line naming it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
# Importing dynamo while the recorder's dispatch mode is active would keep that frame's
# tensors alive for good (see dtrlab.trace.capture): import it first.
import torch._dynamo  # noqa: F401
from torch import fx, nn

from ..capture import Recorder
from ..model import Trace
from ..op_temporaries import OpTemporaries, temporaries_setting
from ..simrd_log import parse_lines
from .cuda_joint import cuda_attention, retrace_on_cuda
from .gpu_target import device_answers

KNOB = "activation_memory_budget"
SOLVERS = ("dp", "greedy", "ilp", "dp_knapsack_sliding_hirschberg")
#: The partitioner's recompute cost estimators (torch/_functorch/partitioners.py:3401, ``estimate_runtime``;
#: "profile" benchmarks each operator on a GPU).
RUNTIME_ESTIMATORS = ("flops", "profile", "testing")
#: The torch.compile backends whose joint graph :func:`trace_joint` keeps: Inductor's (its decompositions and
#: joint-graph passes, what ``torch.compile``'s default backend partitions) and aot_eager's.
BACKENDS = ("inductor", "aot_eager")
#: How a node is forced in :func:`partition`: torch's selective-checkpoint policies, the
#: partitioner's own hooks (``node.meta["recompute"]``).
FORCINGS = ("save", "recompute")
#: The rules a partitioned step is recorded by, in the keys of answers cached from its peaks (dtrlab.compile's):
#: a change that moves a recorded step's memory bumps it. 2 (4 December 2026): a tensor's gradients from two
#: graphs summed in place, as autograd sums them (:func:`_add_gradients`); graph outputs held until the last
#: graph's forward has run (:func:`run_parts`); a one-graph step's loss gradient of the loss's dtype. 3 (6 December
#: 2026): operators' measured temporaries (dtrlab.trace.op_temporaries), on by default for a CPU target.
RECORDING_VERSION = 3


@dataclass(frozen=True)
class JointGraph:
    """A training step's joint forward+backward graph as AOT autograd hands it to the partitioner."""

    source: str
    build_options: tuple[tuple[str, object], ...]
    graph_module: fx.GraphModule = field(compare=False, repr=False)
    joint_inputs: tuple = field(compare=False, repr=False)
    num_fwd_outputs: int
    static_lifetime_input_indices: tuple[int, ...]
    #: Names of the joint graph's forward operators (those that do not depend on a tangent).
    forward_nodes: frozenset[str] = field(repr=False)
    torch_version: str
    desc: str = ""
    #: torch's ``estimate_runtime`` per (node name, estimator): a node's estimate does not depend on the knob.
    runtime_estimates: dict = field(default_factory=dict, compare=False, repr=False)
    #: torch's ``solve_min_cut`` answers on this graph, by node names (see :func:`partition`'s ``reuse_min_cuts``).
    min_cuts: dict = field(default_factory=dict, compare=False, repr=False)
    #: A step with graph breaks: one single-graph JointGraph per compiled-graph call, in execution order
    #: (empty for a one-graph step, whose graph is this one's). See :class:`StepLinks`.
    parts: tuple = field(default=(), compare=False, repr=False)
    links: StepLinks | None = field(default=None, compare=False, repr=False)
    #: The torch.compile backend whose joint graph this is (see :data:`BACKENDS`).
    backend: str = "aot_eager"
    #: Inductor's: what its compile held when it partitioned (:class:`InductorCapture`), for lowering later.
    inductor: InductorCapture | None = field(default=None, compare=False, repr=False)
    #: Lowered partitions by content (dtrlab.trace.torch_compile.inductor): many knob values give the same graphs. For a step
    #: with graph breaks, each graph's lowerings are its part's.
    lowerings: dict = field(default_factory=dict, compare=False, repr=False)
    #: The lowered step's records by its graphs' content (dtrlab.trace.torch_compile.inductor).
    lowered_records: dict = field(default_factory=dict, compare=False, repr=False)
    #: The GPU the graph was re-traced for (dtrlab.trace.torch_compile.cuda_joint: a :data:`~dtrlab.trace.torch_compile.gpu_target.GPU_TARGETS`
    #: name; partitioned and lowered under its answers), or None: the device its fake tensors claim answers itself.
    gpu: str | None = None

    @property
    def node_count(self) -> int:
        return len(self.graph_module.graph.nodes)

    def operator_nodes(self) -> list[str]:
        """Names of the joint graph's operator nodes (``call_function``), in graph order."""
        return [node.name for node in self.graph_module.graph.nodes if node.op == "call_function"]


@dataclass(frozen=True)
class StepLinks:
    """How the graphs of a step with graph breaks hand tensors to one another (by position).

    ``inputs[c][j]``: where part ``c``'s forward input ``j`` comes from: ``("out", c2, m)``, forward
    output ``m`` of an earlier part, or ``("in", c2, j2)``, a tensor first met as an earlier (or
    this) part's input (a parameter, an input, a tensor eager code made). ``needs_grad[c][m]``:
    whether part ``c``'s forward output ``m`` gets a tangent in its backward. ``loss``: ``(c, m)``.
    """

    inputs: tuple[tuple[tuple[str, int, int], ...], ...]
    needs_grad: tuple[tuple[bool, ...], ...]
    loss: tuple[int, int]


@dataclass(frozen=True)
class InductorCapture:
    """What Inductor's ``compile_fx`` held when it called its partition function: enough to lower the graphs."""

    #: The tracing context of the compile (its ``fw_metadata`` tells the forward which outputs the user sees).
    tracing_context: object
    fake_mode: object
    #: The graph dynamo handed to Inductor: its input and output counts.
    dynamo_graph: fx.GraphModule
    #: AOT autograd's ``ViewAndMutationMeta`` of the step (its tracing context holds it once the forward
    #: compiles, after the partition: Inductor reads mutated inputs and donated buffers from it).
    fw_metadata: object = None


@dataclass(frozen=True)
class SavedTensor:
    """One tensor the forward graph saves for the backward (a forward output after the loss)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    #: Bytes as the partitioner counts them (``partitioners._size_of``: numel x itemsize).
    nbytes: int


@dataclass(frozen=True)
class PartitionedStep:
    """What torch's partitioner decided for one knob value, and the step it makes."""

    source: str
    knob: float
    solver: str
    runtime_estimator: str
    torch_version: str
    saved: tuple[SavedTensor, ...]
    #: Forward operators that the backward graph computes (again, or only there), by joint-graph name.
    recomputed: tuple[str, ...]
    #: The partitioner's objective: the saved tensors' bytes by its own measure (``_size_of``).
    proxy_saved_bytes: int
    #: Its recompute cost estimate: ``estimate_runtime`` (the configured estimator) summed over ``recomputed``.
    proxy_recompute_runtime: float
    #: The step as a dtrlab trace: forward then backward operators (costs: FLOPs, capture's cost model).
    trace: Trace = field(compare=False, repr=False)
    #: Peak bytes of live storages while the recorder ran the two graphs (the flat replay must agree).
    recorded_peak_bytes: int = 0
    #: Forward-graph operator count (the trace's first ``forward_ops`` operators that are not constants).
    forward_ops: int = 0
    forward: fx.GraphModule | None = field(default=None, compare=False, repr=False)
    backward: fx.GraphModule | None = field(default=None, compare=False, repr=False)
    forced: tuple[tuple[str, str], ...] = ()
    #: (forward, backward) graph modules per compiled graph in forward order (``keep_graphs``; else empty).
    graphs: tuple[tuple[fx.GraphModule, fx.GraphModule], ...] = field(default=(), compare=False, repr=False)
    #: Whose step the trace is: ``"aot_eager"`` (the graphs run node by node) or ``"inductor"``
    #: (Inductor's lowered wrappers, dtrlab.trace.torch_compile.inductor).
    backend: str = "aot_eager"

    @property
    def saved_count(self) -> int:
        return len(self.saved)

    @property
    def recomputed_count(self) -> int:
        return len(self.recomputed)

    @property
    def recompute_flops(self) -> int:
        """FLOPs of the backward's recomputed operators (capture's FLOP model, as in the trace)."""
        recomputed = set(self.recomputed)
        return sum(op.cost for op, name in zip(self.trace.operators, self.trace.meta["node_names"])
                   if op.backward and name in recomputed)


def check_knob(knob) -> float:
    """The knob as a float in [0, 1], or a one-line ValueError naming it."""
    if isinstance(knob, bool) or not isinstance(knob, (int, float)) or not 0.0 <= float(knob) <= 1.0:
        raise ValueError(f"{KNOB} must be a number in [0, 1] (a ratio of saved activation memory), got {knob!r}")
    return float(knob)


def check_torch_has_knob() -> None:
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, KNOB):
        raise ValueError(f"torch {torch.__version__} has no torch._functorch.config.{KNOB} "
                         "(torch.compile's activation memory budget, added in torch 2.4)")


class _JointCaptured(Exception):
    """Raised by the capturing partition function to stop the compile once the joint graph is kept."""


def trace_joint(source: str, *, batch: int | None = None, seq: int | None = None, image: int = 224,
                dtype: torch.dtype | None = None, autocast: torch.dtype | None = None, device: str = "cpu",
                backend: str = "aot_eager", gpu: str | None = None,
                **sizes) -> JointGraph:
    """Trace ``source``'s training step once into the joint graph torch.compile would partition.

    Build options are :func:`dtrlab.trace.models.build`'s (``dtype``, ``autocast`` among them). ``device``: the device the fake
    tensors claim ("cpu"; "cuda" traces the kernels a GPU step picks, e.g. its flash
    attention, with no GPU needed). ``backend``: whose joint graph (:data:`BACKENDS`):
    ``"inductor"`` runs ``torch.compile(backend="inductor")`` up to its partition function
    (``torch/_inductor/compile_fx.py:2466``, ``partition_fn``: Inductor's decompositions, then
    its joint-graph passes at :2484, then ``min_cut_rematerialization_partition(...,
    compiler="inductor")`` at :2506) and keeps the graph it hands the partitioner.
    ``gpu``: a :data:`~dtrlab.trace.torch_compile.gpu_target.GPU_TARGETS` name: the step as torch.compile traces it for
    that GPU, without one (:mod:`dtrlab.trace.torch_compile.cuda_joint`: traced on the CPU with CUDA's attention kernels,
    then re-traced on fake CUDA tensors); partitioned and lowered under the GPU's answers.
    Raises ``ValueError`` (one line) for an unknown source or backend or a step dynamo cannot
    capture (graph breaks are followed under aot_eager: see ``parts``).
    """
    from ..models import fake_workload

    check_torch_has_knob()
    options = {"batch": batch, "seq": seq, "image": image, "dtype": dtype, "autocast": autocast, **sizes}
    with fake_workload(source, device=device, **options) as workload:
        pass  # dynamo makes its own fake tensors from these: the step is compiled outside this mode
    named = {**options, "device": device, "gpu": gpu}
    build_options = tuple(sorted((k, _option_value(v)) for k, v in named.items() if v is not None))
    return trace_step(workload.module, workload.inputs, workload.loss_fn, source=source,
                      build_options=build_options, desc=workload.desc, backend=backend, gpu=gpu)


def for_gpu(joint: JointGraph, gpu: str) -> JointGraph:
    """``joint`` re-traced on fake CUDA tensors for GPU ``gpu`` (:func:`dtrlab.trace.torch_compile.cuda_joint.retrace_on_cuda`),
    each graph of a step with graph breaks on its own. Node names stay ``joint``'s."""
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


def _joint_graph(source: str, build_options: tuple, kept: dict, desc: str, backend: str) -> JointGraph:
    graph_module = kept["graph_module"]
    return JointGraph(
        source=source, build_options=build_options, graph_module=graph_module,
        joint_inputs=tuple(kept["joint_inputs"]), num_fwd_outputs=kept["num_fwd_outputs"],
        static_lifetime_input_indices=tuple(kept.get("static_lifetime_input_indices") or ()),
        forward_nodes=_forward_nodes(graph_module.graph), torch_version=torch.__version__, desc=desc,
        backend=backend, inductor=kept.get("inductor"))


def _one_graph(step: nn.Module, inputs: tuple, source: str, backend: str) -> dict | None:
    """The step's joint graph when dynamo captures it in one graph (``fullgraph=True``); None at a graph break."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.exc import Unsupported

    kept: dict = {}

    def keep_joint(joint_module, joint_inputs, **kwargs):
        kept.update(graph_module=joint_module, joint_inputs=joint_inputs, **kwargs)
        raise _JointCaptured

    if backend == "inductor":
        compile_backend, intercept = "inductor", _inductor_partition_kept(keep_joint, kept)
    else:
        compile_backend = aot_autograd(fw_compiler=_identity_compiler, partition_fn=keep_joint)
        intercept = contextlib.nullcontext()
    torch._dynamo.reset()
    try:
        with intercept:
            torch.compile(step, backend=compile_backend, fullgraph=True, dynamic=False)(*inputs)
    except Unsupported:  # a graph break, before any backend ran
        return None
    except Exception as exc:  # dynamo wraps what the backend raises
        if "graph_module" not in kept:
            raise _untraceable(source, exc) from exc
    finally:
        torch._dynamo.reset()
    return kept


def _untraceable(source: str, exc: BaseException) -> ValueError:
    from ..models import ModelSourceError

    cause = getattr(exc, "inner_exception", None) or exc  # what the backend itself raised
    # The error at the chain's root: dynamo raises its own (TorchRuntimeError: "RuntimeError when making fake tensor
    # call") while handling the operator's, which says what is wrong.
    while (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    return ModelSourceError(f"{source}: torch.compile cannot trace its training step: "
                            f"{type(cause).__name__}: {_first_line(cause)}")


def _graph_parts(step: nn.Module, inputs: tuple, source: str, build_options: tuple, desc: str,
                 backend: str) -> JointGraph:
    """A step with graph breaks, run by torch.compile (aot_autograd, torch's partitioner at knob 1.0)
    on the fake tensors: each graph's joint kept, and which tensors each call of a graph received
    and returned (:class:`StepLinks`). Graphs without a backward (nothing in them needs a
    gradient) and the eager code between graphs are not part of the trace. ``backend="inductor"``:
    each graph dynamo hands the backend also goes through Inductor's ``compile_fx`` up to its partition
    function (:func:`_inductor_joint`), and that joint is the part's (the step still runs on aot_autograd's
    graphs, to follow the tensors from graph to graph)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

    from ..models import ModelSourceError

    graphs: list[dict | None] = []
    calls: list[tuple[int, list, list]] = []

    def keep_joint(joint_module, joint_inputs, **kwargs):
        with _use_lazy_graph_module(True):
            kept = _make_graph_module(joint_module, copy.deepcopy(joint_module.graph))
        graphs[-1] = dict(graph_module=kept, joint_inputs=joint_inputs, **kwargs)
        return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)

    aot = aot_autograd(fw_compiler=_identity_compiler, bw_compiler=_identity_compiler, partition_fn=keep_joint)

    inductor_joints: list[dict | None] = []

    def compile_graph(graph_module, example_inputs):
        graphs.append(None)
        compiled = aot(graph_module, example_inputs)
        # Inductor after aot_autograd: Inductor's pre-grad passes may rewrite the dynamo graph in place.
        inductor_joints.append(_inductor_joint(graph_module, example_inputs)
                               if backend == "inductor" and graphs[-1] is not None else None)
        return _calls_noted(compiled, len(graphs) - 1, calls)

    torch._dynamo.reset()
    try:
        loss = torch.compile(step, backend=compile_graph, dynamic=False)(*inputs)
    except Exception as exc:
        raise _untraceable(source, exc) from exc
    finally:
        torch._dynamo.reset()
    used = [(graphs[index], args, outputs) for index, args, outputs in calls if graphs[index] is not None]
    links = _step_links(source, used, loss)
    if backend == "inductor":
        kept_joints = [inductor_joints[index] for index, _, _ in calls if graphs[index] is not None]
        for c, ((aot_kept, _, _), kept) in enumerate(zip(used, kept_joints)):
            if "graph_module" not in kept or _signature(kept) != _signature(aot_kept):
                raise ModelSourceError(f"{source}: graph {c}'s joint under Inductor takes or gives other tensors "
                                       "than under aot_autograd, which dtrlab does not model")
    else:
        kept_joints = [kept for kept, _, _ in used]
    parts = tuple(_joint_graph(source, build_options, kept, desc, backend) for kept in kept_joints)
    first = parts[0]
    return JointGraph(
        source=source, build_options=build_options, graph_module=first.graph_module,
        joint_inputs=first.joint_inputs, num_fwd_outputs=first.num_fwd_outputs,
        static_lifetime_input_indices=first.static_lifetime_input_indices,
        forward_nodes=frozenset(f"g{c}.{name}" for c, part in enumerate(parts) for name in part.forward_nodes),
        torch_version=torch.__version__, desc=desc, parts=parts, links=links, backend=backend)


def _inductor_joint(graph_module: fx.GraphModule, example_inputs) -> dict:
    """The joint graph Inductor's ``compile_fx`` hands its partitioner for one graph dynamo compiles, and what
    lowering it needs (:func:`_inductor_partition_kept`); the compile stops there."""
    from torch._inductor.compile_fx import compile_fx

    kept: dict = {}

    def keep_joint(joint_module, joint_inputs, **kwargs):
        kept.update(graph_module=joint_module, joint_inputs=joint_inputs, **kwargs)
        raise _JointCaptured

    with _inductor_partition_kept(keep_joint, kept):
        try:
            compile_fx(graph_module, example_inputs)
        except _JointCaptured:
            pass
    return kept


def _signature(kept: dict) -> tuple:
    """A joint graph's placeholders (primals and tangents: their count and shapes) and forward output count."""
    placeholders = kept["graph_module"].graph.find_nodes(op="placeholder")
    return (tuple((node.name.startswith("tangents"), tuple(node.meta["val"].shape)) for node in placeholders),
            kept["num_fwd_outputs"])


def _calls_noted(compiled, index: int, calls: list):
    """``compiled`` (a dynamo backend's answer), noting each call's input and output tensors in ``calls``."""
    def run(*args):
        outputs = compiled(*args)
        calls.append((index, list(args), list(outputs)))
        return outputs
    return run


def _step_links(source: str, used: list, loss) -> StepLinks:
    from ..models import ModelSourceError

    first_seen: dict[int, tuple[str, int, int]] = {}
    inputs, needs_grad, loss_at = [], [], None
    for c, (kept, args, outputs) in enumerate(used):
        placeholders = kept["graph_module"].graph.find_nodes(op="placeholder")
        primals = [node for node in placeholders if not node.name.startswith("tangents")]
        if len(primals) != len(args) or kept["num_fwd_outputs"] != len(outputs):
            raise ModelSourceError(f"{source}: graph {c} of its step mutates or aliases its inputs across a graph "
                                   "break, which dtrlab does not model")
        inputs.append(tuple(first_seen.setdefault(id(a), ("in", c, j)) for j, a in enumerate(args)))
        for m, output in enumerate(outputs):
            first_seen.setdefault(id(output), ("out", c, m))
            if output is loss:
                loss_at = (c, m)
        grads = tuple(isinstance(o, torch.Tensor) and o.requires_grad for o in outputs)
        if sum(grads) != len(placeholders) - len(primals):
            raise ModelSourceError(f"{source}: graph {c}'s tangents do not match its outputs that need a gradient")
        needs_grad.append(grads)
    if loss_at is None:
        raise ModelSourceError(f"{source}: its loss is computed outside torch.compile's graphs (eager code after "
                               "the last graph break), which dtrlab does not trace")
    return StepLinks(tuple(inputs), tuple(needs_grad), loss_at)


def meta_module(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device (no memory, no values):
    ``copy.deepcopy`` with each tensor's meta twin in its memo, so the live module is neither copied nor
    touched (hooks, training mode and attributes come along)."""
    memo: dict = {}
    for name, tensor in [*module.named_parameters(remove_duplicate=True), *module.named_buffers()]:
        if id(tensor) in memo:
            continue
        twin = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = nn.Parameter(twin, requires_grad=tensor.requires_grad) \
            if isinstance(tensor, nn.Parameter) else twin
    return copy.deepcopy(module, memo)


@contextlib.contextmanager
def meta_closure(function) -> Iterator[None]:
    """The tensors ``function`` reads from its closure or its module's globals (a loss's labels) replaced by their
    meta twins while the context runs, then restored: a step run on a :func:`meta_module` copy must not meet the
    live tensors a loss refers to. Tensors inside containers, or reached through other functions, are not."""
    def live(value) -> bool:
        return isinstance(value, torch.Tensor) and not value.is_meta

    slots = [(functools.partial(setattr, cell, "cell_contents"), cell.cell_contents)
             for cell in getattr(function, "__closure__", None) or () if live(cell.cell_contents)]
    code, namespace = getattr(function, "__code__", None), getattr(function, "__globals__", {})
    slots += [(functools.partial(namespace.__setitem__, name), namespace[name])
              for name in (code.co_names if code else ()) if live(namespace.get(name))]
    for write, tensor in slots:
        write(torch.empty_like(tensor, device="meta").requires_grad_(tensor.requires_grad))
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


def joint_hash(joint: JointGraph) -> str:
    """sha256 of the joint graph's content: its nodes (operators, arguments), every placeholder's shape,
    strides and dtype, and how many outputs the forward has. Equal graphs, equal hashes; node names are
    dynamo's, deterministic for one model and torch version."""
    import hashlib

    digest = hashlib.sha256()
    for part in joint.parts or (joint,):  # a step with graph breaks: every graph, and how they link
        digest.update(str(part.graph_module.graph).encode())
        for node in part.graph_module.graph.find_nodes(op="placeholder"):
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                digest.update(f"{node.name}:{tuple(value.shape)}:{value.stride()}:{value.dtype}:{value.device}".encode())
        digest.update(f"{part.num_fwd_outputs}:{part.static_lifetime_input_indices}".encode())
    digest.update(repr(joint.links).encode())
    if joint.gpu is not None:  # the GPU Inductor lowers for (its SMs and capability shape the kernels and plan)
        digest.update(f"gpu:{joint.gpu}".encode())
    return digest.hexdigest()


def check_backend(backend) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else a one-line ValueError naming the option."""
    from ...suggest import did_you_mean

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}"
                         f"{did_you_mean(str(backend), list(BACKENDS))}")
    return backend


@contextlib.contextmanager
def _inductor_partition_kept(keep_joint, kept: dict) -> Iterator[None]:
    """Inductor's ``compile_fx`` with its partitioner replaced by ``keep_joint`` (after its joint-graph passes).

    ``compile_fx`` imports ``min_cut_rematerialization_partition`` into its own namespace
    (torch/_inductor/compile_fx.py:30) and its ``partition_fn`` calls that name: replacing it
    there keeps every pass before it. The dynamo graph (``create_compiler_config_extra``'s
    argument), the tracing context and AOT autograd's metadata (``_aot_stage2a_partition``'s
    ``fw_metadata``, torch/_functorch/_aot_autograd/graph_compile.py:2203) are kept too:
    lowering the partitions needs them.
    """
    from torch._functorch._aot_autograd import graph_compile
    from torch._inductor import compile_fx

    partitioner, config_extra = compile_fx.min_cut_rematerialization_partition, compile_fx.create_compiler_config_extra
    stage = graph_compile._aot_stage2a_partition

    def keep_metadata(fx_g, joint_inputs, maybe_subclass_meta, fw_metadata, *args, **kwargs):
        kept["fw_metadata"] = fw_metadata if maybe_subclass_meta is None else maybe_subclass_meta.fw_metadata
        return stage(fx_g, joint_inputs, maybe_subclass_meta, fw_metadata, *args, **kwargs)

    def keep_dynamo_graph(graph_module):
        kept["dynamo_graph"] = graph_module
        return config_extra(graph_module)

    def keep_inductor_joint(joint_module, joint_inputs, compiler=None, **kwargs):
        from torch._guards import detect_fake_mode

        kept["inductor"] = InductorCapture(torch._guards.TracingContext.try_get(), detect_fake_mode(joint_inputs),
                                           kept.pop("dynamo_graph"), kept.pop("fw_metadata", None))
        keep_joint(joint_module, joint_inputs, **kwargs)

    compile_fx.min_cut_rematerialization_partition = keep_inductor_joint
    compile_fx.create_compiler_config_extra = keep_dynamo_graph
    graph_compile._aot_stage2a_partition = keep_metadata
    try:
        yield
    finally:
        compile_fx.min_cut_rematerialization_partition = partitioner
        compile_fx.create_compiler_config_extra = config_extra
        graph_compile._aot_stage2a_partition = stage


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


def _identity_compiler(graph_module, example_inputs):
    return graph_module


def _option_value(value):
    return str(value) if isinstance(value, torch.dtype) else value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _forward_nodes(graph: fx.Graph) -> frozenset[str]:
    """Operator nodes that do not depend on a tangent: the forward part of the joint graph."""
    backward: set[fx.Node] = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and node.name.startswith("tangents")) or \
                any(arg in backward for arg in node.all_input_nodes):
            backward.add(node)
    return frozenset(node.name for node in graph.nodes if node.op == "call_function" and node not in backward)


@contextlib.contextmanager
def partitioner_config(knob: float | None, solver: str | None = None,
                       runtime_estimator: str | None = None) -> Iterator[None]:
    """``torch._functorch.config`` with the knob (and solver, runtime estimator) patched, as a user sets them;
    None leaves a setting as it is."""
    import torch._functorch.config as functorch_config

    from ...suggest import did_you_mean

    settings = {KNOB: check_knob(knob)} if knob is not None else {}
    if solver is not None:
        if solver not in SOLVERS:
            raise ValueError(f"unknown activation_memory_budget_solver {solver!r}{did_you_mean(solver, SOLVERS)}; "
                             f"torch's are {', '.join(SOLVERS)}")
        settings["activation_memory_budget_solver"] = solver
    if runtime_estimator is not None:
        if runtime_estimator not in RUNTIME_ESTIMATORS:
            raise ValueError(f"unknown activation_memory_budget_runtime_estimator {runtime_estimator!r}"
                             f"{did_you_mean(runtime_estimator, RUNTIME_ESTIMATORS)}; torch's are "
                             f"{', '.join(RUNTIME_ESTIMATORS)}")
        settings["activation_memory_budget_runtime_estimator"] = runtime_estimator
    with functorch_config.patch(**settings):
        yield


def partition(joint: JointGraph, knob: float, *, solver: str | None = None,
              force: dict[str, str] | None = None, keep_graphs: bool = False,
              reuse_min_cuts: bool = True, record_with=None, temporaries: bool | None = None) -> PartitionedStep:
    """Call torch's ``min_cut_rematerialization_partition`` on a copy of ``joint`` at ``knob``.

    ``solver``: ``activation_memory_budget_solver`` (None: torch's configured one).
    ``force``: ``{node name: "save" | "recompute"}``, set on the copy as the partitioner's own
    hooks read them: ``node.meta["recompute"] = CheckpointPolicy.MUST_SAVE`` (never
    recomputed: the partitioner bans its recomputation) or ``MUST_RECOMPUTE`` (always
    recomputed in the backward), as selective activation checkpointing tags nodes.
    ``keep_graphs``: keep the forward and backward graph modules on the result.
    ``reuse_min_cuts``: remember the answers of torch's ``solve_min_cut`` (a max-flow over
    the graph, most of a partition's time) on ``joint``, by node names, under the forcing,
    the cut's options, the nodes the knapsack let it recompute and the rest of the
    partitioner's configuration. Three of its four calls per partition do not depend on
    the knob at all; the fourth repeats whenever the knapsack's answer does. The answer is
    torch's either way (tests/test_partition.py compares with ``reuse_min_cuts=False``).
    ``record_with``: how the graphs become the step's trace, a function of ``(pairs, joint)``
    (``pairs``: a (forward, backward) pair per graph) returning ``(trace, recorded peak, forward
    operator count)``; None: run as aot_eager runs them (dtrlab.trace.torch_compile.inductor passes Inductor's lowering).
    ``temporaries``: give each call of an operator that allocates inside (convolutions, batch norm's backward) its
    temporaries, measured once per call on the CPU (:mod:`dtrlab.trace.op_temporaries`); None: on for a CPU
    target, off for a GPU's. Only with ``record_with`` None (Inductor's takes its own).
    """
    check_torch_has_knob()
    knob = check_knob(knob)
    parts = joint.parts or (joint,)

    def named(c: int, name: str) -> str:
        return f"g{c}.{name}" if joint.parts else name

    forcings = _forcings_by_graph(joint, force or {})
    with device_answers(joint.gpu):
        results = []
        for c, part in enumerate(parts):
            with _fake_factories(part):
                results.append(_partition_graph(part, knob, solver, forcings[c], reuse_min_cuts))
        pairs = tuple((r.forward, r.backward) for r in results)
        record = record_with or functools.partial(record_partitioned,
                                                  temporaries=temporaries_setting(temporaries, step_target(joint)))
        trace, peak, forward_ops = record(pairs, joint)

    saved = tuple(dataclasses.replace(s, name=named(c, s.name)) for c, r in enumerate(results) for s in r.saved)
    recomputed = tuple(named(c, name) for c, r in enumerate(results) for name in r.recomputed)
    first = results[0]
    return PartitionedStep(
        source=joint.source, knob=knob, solver=first.solver, runtime_estimator=first.estimator,
        torch_version=torch.__version__, saved=saved, recomputed=recomputed,
        proxy_saved_bytes=sum(s.nbytes for s in saved),
        proxy_recompute_runtime=sum(r.proxy_runtime for r in results), trace=trace,
        recorded_peak_bytes=peak, forward_ops=forward_ops,
        forward=first.forward if keep_graphs and not joint.parts else None,
        backward=first.backward if keep_graphs and not joint.parts else None,
        forced=tuple(sorted((named(c, name), how) for c, r in enumerate(results) for name, how in r.forced)),
        graphs=pairs if keep_graphs else (), backend="aot_eager" if record_with is None else joint.backend)


def joint_device(joint: JointGraph) -> str:
    """The device type(s) of the joint graph's inputs (``cpu``; ``cuda`` for a GPU's step)."""
    devices = {node.meta["val"].device.type for part in joint.parts or (joint,)
               for node in part.graph_module.graph.find_nodes(op="placeholder")
               if isinstance(node.meta.get("val"), torch.Tensor)}
    return ",".join(sorted(devices))


def step_target(joint: JointGraph) -> str:
    """Where the step runs, as operators' temporaries are measured for it: the GPU it was traced for, else
    :func:`joint_device` (a step traced on CUDA tensors is not the CPU's either)."""
    return joint.gpu or joint_device(joint)


def _fake_factories(joint: JointGraph):
    """A GPU joint's fake mode while torch partitions it: the partitioner's cost estimate runs each operator on its
    inputs' fake values (``estimate_runtime``, torch/_functorch/partitioners.py:3401-3436), and an operator without
    tensor inputs (``full(..., device=cuda)``) would otherwise allocate on a GPU there is not."""
    if joint.gpu is None:
        return contextlib.nullcontext()
    from torch._guards import detect_fake_mode

    return detect_fake_mode(list(joint.joint_inputs))


def _forcings_by_graph(joint: JointGraph, force: dict[str, str]) -> list[dict[str, str]]:
    """``force`` split by graph: a step with graph breaks names its nodes ``g<graph>.<node>``."""
    from ...suggest import did_you_mean

    if not joint.parts:
        return [force]
    split: list[dict[str, str]] = [{} for _ in joint.parts]
    for name, how in force.items():
        graph, _, node = name.partition(".")
        index = int(graph[1:]) if graph[:1] == "g" and graph[1:].isdigit() else -1
        if not 0 <= index < len(joint.parts):
            raise ValueError(f"no operator node {name!r} in the step's graphs (names are g<graph>.<node>)"
                             f"{did_you_mean(name, sorted(joint.forward_nodes))}")
        split[index][node] = how
    return split


@dataclass(frozen=True)
class _GraphPartition:
    forward: fx.GraphModule
    backward: fx.GraphModule
    saved: tuple[SavedTensor, ...]
    recomputed: tuple[str, ...]
    proxy_runtime: float
    solver: str
    estimator: str
    forced: tuple[tuple[str, str], ...]


def _partition_graph(joint: JointGraph, knob: float, solver: str | None, force: dict[str, str],
                     reuse_min_cuts: bool) -> _GraphPartition:
    """torch's partitioner on a copy of one joint graph (see :func:`partition`)."""
    import torch._functorch.config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

    # Lazy graph modules: Python code for the graphs is generated only if something runs them
    # (the interpreter below does not), as torch.compile itself does while it partitions.
    with _use_lazy_graph_module(True):
        graph_module = _make_graph_module(joint.graph_module, copy.deepcopy(joint.graph_module.graph))
    forced = _apply_forcing(graph_module, force)
    reuse = _reused_min_cuts(joint, forced) if reuse_min_cuts else contextlib.nullcontext()
    with partitioner_config(knob, solver), reuse, _use_lazy_graph_module(True):
        used_solver = functorch_config.activation_memory_budget_solver
        estimator = functorch_config.activation_memory_budget_runtime_estimator
        forward, backward = min_cut_rematerialization_partition(
            graph_module, list(joint.joint_inputs), num_fwd_outputs=joint.num_fwd_outputs,
            static_lifetime_input_indices=list(joint.static_lifetime_input_indices))
        saved = _saved_tensors(forward, joint.num_fwd_outputs)
        recomputed = tuple(node.name for node in backward.graph.nodes
                           if node.op == "call_function" and node.name in joint.forward_nodes)
        proxy_runtime = _proxy_runtime(backward, set(recomputed), joint.runtime_estimates, str(estimator))
    return _GraphPartition(forward, backward, saved, recomputed, proxy_runtime, str(used_solver), str(estimator),
                           forced)


@contextlib.contextmanager
def _reused_min_cuts(joint: JointGraph, forced: tuple) -> Iterator[None]:
    """torch's ``solve_min_cut``, answering again from ``joint.min_cuts`` what it answered before."""
    import torch._functorch.config as functorch_config
    from torch._functorch import partitioners

    solve_min_cut = partitioners.solve_min_cut
    settings = functorch_config.get_config_copy()
    for knob_setting in (KNOB, "activation_memory_budget_solver"):
        settings.pop(knob_setting, None)
    context = (forced, repr(sorted(settings.items())))

    def remembered(joint_graph, node_info, min_cut_options, dont_ban=None):
        key = (context, dataclasses.astuple(min_cut_options), frozenset(n.name for n in dont_ban or ()))
        if key not in joint.min_cuts:
            saved, banned = solve_min_cut(joint_graph, node_info, min_cut_options, dont_ban)
            joint.min_cuts[key] = ([n.name for n in saved], [n.name for n in banned])
        nodes = {node.name: node for node in joint_graph.nodes}
        saved_names, banned_names = joint.min_cuts[key]
        return [nodes[name] for name in saved_names], partitioners.OrderedSet(nodes[name] for name in banned_names)

    partitioners.solve_min_cut = remembered
    try:
        yield
    finally:
        partitioners.solve_min_cut = solve_min_cut


def _apply_forcing(graph_module: fx.GraphModule, force: dict[str, str]) -> tuple[tuple[str, str], ...]:
    from torch.utils.checkpoint import CheckpointPolicy

    from ...suggest import did_you_mean

    nodes = {node.name: node for node in graph_module.graph.nodes if node.op == "call_function"}
    for name, how in sorted(force.items()):
        if name not in nodes:
            raise ValueError(f"no operator node {name!r} in the joint graph{did_you_mean(name, list(nodes))}")
        if how not in FORCINGS:
            raise ValueError(f"node {name!r}: force must be one of {', '.join(FORCINGS)}, got {how!r}")
        nodes[name].meta["recompute"] = (CheckpointPolicy.MUST_SAVE if how == "save"
                                         else CheckpointPolicy.MUST_RECOMPUTE)
    return tuple(sorted(force.items()))


def _saved_tensors(forward: fx.GraphModule, num_fwd_outputs: int) -> tuple[SavedTensor, ...]:
    from torch._functorch.partitioners import _size_of

    outputs = _output_nodes(forward)
    saved = []
    for node in outputs[num_fwd_outputs:]:
        value = node.meta.get("val") if isinstance(node, fx.Node) else None
        if isinstance(value, torch.Tensor):
            saved.append(SavedTensor(node.name, tuple(int(d) for d in value.shape), str(value.dtype).replace(
                "torch.", ""), int(_size_of(node))))
    return tuple(saved)


def _proxy_runtime(backward: fx.GraphModule, recomputed: set[str], estimates: dict, estimator: str) -> float:
    """The partitioner's runtime estimate (its configured estimator) of the recomputed operators."""
    from torch._functorch.partitioners import estimate_runtime

    total = 0.0
    for node in backward.graph.nodes:
        if node.name in recomputed and isinstance(node.target, torch._ops.OpOverload):
            key = (node.name, estimator)
            if key not in estimates:
                estimates[key] = float(estimate_runtime(node))
            total += estimates[key]
    return total


def placeholder_tensors(graph_module: fx.GraphModule) -> list[torch.Tensor]:
    """A meta tensor per placeholder of the forward graph, of its shape, strides and dtype (what is allocated does
    not depend on values)."""
    values = [node.meta["val"] for node in graph_module.graph.find_nodes(op="placeholder")]
    return [torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="meta")
            for value in values]


def run_graphs(forward: fx.GraphModule, backward: fx.GraphModule, primals: list[torch.Tensor],
               recorder: Recorder, num_fwd_outputs: int, calls: tuple | None) -> None:
    """Run the forward graph on ``primals`` then the backward on its saved outputs, under ``recorder``.

    Boxed runs, as aot_eager's compiled graphs run: each graph drops its inputs and every
    intermediate after its last use (``fx.Interpreter.boxed_run``). The loss and the
    gradients are kept to the end of the step (and the forward's other ``num_fwd_outputs``
    outputs: new values of buffers the step updates), and so are ``primals`` (held by the caller, as
    a module holds its parameters). ``calls``: the (forward, backward) callables that run
    each graph on its boxed argument list (None: the graphs themselves, node by node; Inductor's
    lowered wrappers in dtrlab.trace.torch_compile.inductor).
    """
    device = primals[0].device
    # A fresh interpreter per call: one kept alive would hold the values of its graph's output node.
    forward_call, backward_call = calls or (
        lambda arguments: _NodeInterpreter(forward, recorder, device).boxed_run(arguments),
        lambda arguments: _NodeInterpreter(backward, recorder, device).boxed_run(arguments))
    output_names = [node.name if isinstance(node, fx.Node) else None for node in _output_nodes(forward)]
    backward_inputs = [node.name for node in backward.graph.find_nodes(op="placeholder")]
    # The loss's gradient, of the dtype the backward expects (the loss's: float32 for a bfloat16 model whose loss
    # casts to float32).
    expected = next(node.meta["val"] for node in backward.graph.find_nodes(op="placeholder")
                    if node.name.startswith("tangents"))
    tangent = torch.ones((), dtype=expected.dtype, device=device)
    recorder._emit(INSTRUCTION="ANNOTATE", ANNOTATION="START")
    for t in primals + [tangent]:
        recorder.name_of(t)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as in capture.record: collection at random points would move releases
    try:
        with recorder:
            forward_outputs = forward_call(list(primals))
            outputs = dict(zip(output_names, forward_outputs))
            del forward_outputs
            # The step's outputs: the loss (and new values of buffers it updates, e.g. batch norm's running stats).
            loss = [outputs[name] for name in output_names[:num_fwd_outputs]]
            recorder.flush_releases()
            recorder._emit(INSTRUCTION="ANNOTATE", ANNOTATION="BACKWARD")
            arguments = [tangent if name.startswith("tangents") else outputs[name] for name in backward_inputs]
            del outputs
            gradients = backward_call(arguments)
        recorder.close()
    finally:
        if gc_was_enabled:
            gc.enable()
    del loss, gradients


def run_parts(pairs: tuple, joint: JointGraph, recorder: Recorder, calls: tuple | None = None) -> None:
    """Run a step with graph breaks under ``recorder`` as torch.compile runs it (aot_eager's boxed graphs, or
    ``calls``: per graph, :func:`run_graphs`'s (forward, backward) callables).

    The forward graphs in order, each handed the tensors :class:`StepLinks` says it received
    (a parameter used by two graphs is one tensor); a graph's outputs are held until the last graph's
    forward has run, its saved tensors until its backward. The Python frames dynamo resumes the step in
    hold what they passed on until the forward returns: measured, an output the next graph reads and
    no later one still counts at the last graph's peak (docs/compile.md).
    Then the backward graphs in reverse order, each handed its saved tensors and its tangents:
    the loss's gradient (ones), or the gradients later graphs' backwards produced for the
    tensors this graph output (summed when several graphs used one, in place as autograd sums them; zeros when
    none did, as autograd materialises them). Gradients of the step's inputs live to its end.
    """
    links, device = joint.links, torch.device("meta")
    constants = {}
    for c, (forward, _) in enumerate(pairs):
        for key, tensor in zip(links.inputs[c], placeholder_tensors(forward)):
            if key == ("in", c, key[2]):
                constants[key] = tensor
    loss_value = _output_nodes(pairs[links.loss[0]][0])[links.loss[1]].meta["val"]
    tangent = torch.ones((), dtype=loss_value.dtype, device=device)
    recorder._emit(INSTRUCTION="ANNOTATE", ANNOTATION="START")
    for t in [*constants.values(), tangent]:
        recorder.name_of(t)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as in capture.record: collection at random points would move releases
    try:
        with recorder:
            saved, loss = _run_forwards(pairs, joint, recorder, constants, calls)
            recorder.flush_releases()
            recorder._emit(INSTRUCTION="ANNOTATE", ANNOTATION="BACKWARD")
            gradients = _run_backwards(pairs, joint, recorder, saved, tangent, calls)
        recorder.close()
    finally:
        if gc_was_enabled:
            gc.enable()
    del loss, gradients, constants


def _output_nodes(graph_module: fx.GraphModule) -> list:
    return list(graph_module.graph.find_nodes(op="output")[0].args[0])


def _run_forwards(pairs: tuple, joint: JointGraph, recorder: Recorder, constants: dict,
                  calls: tuple | None) -> tuple[list, object]:
    """The forward graphs in order: (per graph, its saved tensors by name; the loss). Every graph's outputs are held
    until the last forward has run (:func:`run_parts`)."""
    links, outputs, saved = joint.links, {}, []
    for c, (forward, _) in enumerate(pairs):
        arguments = [constants[key] if key[0] == "in" else outputs[key[1], key[2]] for key in links.inputs[c]]
        results = calls[c][0](arguments) if calls else \
            _NodeInterpreter(forward, recorder, torch.device("meta"), f"g{c}.").boxed_run(arguments)
        count = joint.parts[c].num_fwd_outputs
        names = [node.name if isinstance(node, fx.Node) else None for node in _output_nodes(forward)]
        outputs.update(((c, m), value) for m, value in enumerate(results[:count]))
        saved.append(dict(zip(names[count:], results[count:])))
        del arguments, results
    return saved, outputs[links.loss]


def _run_backwards(pairs: tuple, joint: JointGraph, recorder: Recorder, saved: list, tangent,
                   calls: tuple | None) -> dict:
    """The backward graphs in reverse order; returns the gradients of the step's inputs (and any left over)."""
    links, gradients = joint.links, {}
    for c in reversed(range(len(pairs))):
        forward, backward = pairs[c]
        tangents = _tangents(forward, c, links, gradients, tangent)
        arguments = [tangents.pop(0) if node.name.startswith("tangents") else saved[c][node.name]
                     for node in backward.graph.find_nodes(op="placeholder")]
        saved[c] = None
        del tangents
        results = calls[c][1](arguments) if calls else \
            _NodeInterpreter(backward, recorder, tangent.device, f"g{c}.").boxed_run(arguments)
        _add_gradients(gradients, links.inputs[c], results)
        del arguments, results  # a gradient added to an earlier one is freed here, before the next graph's backward
    return gradients


def _add_gradients(gradients: dict, keys: tuple, results: list) -> None:
    """One backward graph's gradients (``results``, of the tensors ``keys`` names) added to ``gradients``. A tensor
    that has a gradient already gets the sum, as autograd's input buffer adds two gradients of one tensor with grad
    mode off (torch/csrc/autograd/input_buffer.cpp, ``accumulate``): in place into the earlier gradient when it is
    dense and nothing else holds it or its storage (``can_accumulate_inplace``), else into a new tensor. In place,
    the sum is made outside the recorder: it allocates nothing, and a log's ``MUTATE`` would be a copy (a fresh
    storage: simrd's semantics), so the trace shows the later gradient freed unread, and no operator for the sum."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    from torch.utils._python_dispatch import _disable_current_modes

    for key, gradient in zip(keys, results):
        if not isinstance(gradient, torch.Tensor):
            continue
        earlier = gradients.get(key)
        if earlier is None:
            gradients[key] = gradient
            continue
        # The storage's count: its tensors, and the storage object asked for here.
        alone = (torch._C._storage_Use_Count(earlier.untyped_storage()._cdata) == 2
                 and sum(value is earlier for value in gradients.values()) == 1)
        if alone and is_non_overlapping_and_dense_or_false(earlier):
            with _disable_current_modes():
                earlier.add_(gradient)
        else:
            gradients[key] = earlier + gradient


def _tangents(forward: fx.GraphModule, c: int, links: StepLinks, gradients: dict, tangent) -> list:
    """Part ``c``'s tangents, taken out of ``gradients`` (so that nothing else holds them while its backward runs)."""
    values = [node.meta["val"] for node in _output_nodes(forward)]
    tangents = []
    for m, needs in enumerate(links.needs_grad[c]):
        if needs:
            given = tangent if (c, m) == links.loss else gradients.pop(("out", c, m), None)
            tangents.append(given if given is not None else
                            torch.zeros(values[m].shape, dtype=values[m].dtype, device=tangent.device))
    return tangents


class _NodeInterpreter(fx.Interpreter):
    """Runs a graph node by node, telling the recorder which node runs (for the trace's node names),
    with the devices operators name (``_to_copy(device=cpu)``) replaced by the run's device."""

    def __init__(self, graph_module: fx.GraphModule, recorder: Recorder, device: torch.device, prefix: str = ""):
        super().__init__(graph_module, garbage_collect_values=True)
        self.recorder = recorder
        self.device = device
        self.prefix = prefix  # a step with graph breaks: its graph's tag on node names

    def run_node(self, node):
        self.recorder.node_name = self.prefix + node.name
        return super().run_node(node)

    def get_attr(self, target, args, kwargs):
        """A tensor the graph holds (a constant dynamo lifted, e.g. transformers' empty KV cache
        ``torch.tensor([])``), on the run's device like the rest: made outside the recorder, so a
        constant of the step."""
        from torch.utils._python_dispatch import _disable_current_modes

        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and value.device != self.device:
            with _disable_current_modes():
                value = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=self.device)
        return value

    def call_function(self, target, args, kwargs):
        def moved(value):
            return self.device if isinstance(value, torch.device) else value

        return super().call_function(target, tuple(moved(v) for v in args), {k: moved(v) for k, v in kwargs.items()})


def record_partitioned(pairs: tuple, joint: JointGraph, calls: tuple | None = None, temporaries: str | None = None,
                       cache=True) -> tuple[Trace, int, int]:
    """The partitioned step (one (forward, backward) pair per graph) as a dtrlab trace (meta tensors, FLOP
    costs), its recorded peak, forward op count. ``calls``: per graph, :func:`run_graphs`'s (None: the graphs
    run as aot_eager runs them). ``temporaries``: the device the operators' temporaries are measured for
    (:func:`~dtrlab.trace.op_temporaries.temporaries_setting`), None for none; ``cache``: where the measurements
    are kept (:class:`~dtrlab.trace.op_temporaries.OpTemporaries`'s)."""
    measured = OpTemporaries(temporaries, cache) if temporaries is not None else None
    recorder = _NodeNamingRecorder("flops", 1, measured)
    if joint.parts:
        run_parts(pairs, joint, recorder, calls)
    else:
        [(forward, backward)] = pairs
        primals = placeholder_tensors(forward)
        run_graphs(forward, backward, primals, recorder, joint.num_fwd_outputs, calls[0] if calls else None)
        del primals
    # The recorder's lines are the log's records already (capture writes them as JSON).
    trace = parse_lines((), source=f"<{joint.source} partitioned>", name=joint.source,
                        records=list(enumerate(recorder.lines, 1)))
    if measured is not None:
        measured.report()
    node_names = tuple(recorder.operator_nodes)
    trace.meta.update(node_names=node_names, torch_version=torch.__version__, cost_model="flops",
                      cost_unit="flop")
    forward_ops = sum(1 for line in recorder.lines[:recorder.backward_line]
                      if line["INSTRUCTION"] in ("CALL", "MUTATE"))
    return trace, recorder.peak_live_bytes, forward_ops


class _NodeNamingRecorder(Recorder):
    """The capture's recorder, also noting each operator's graph node and where the backward starts."""

    def __init__(self, cost: str, repeats: int, temporaries=None):
        super().__init__(cost, repeats, temporaries)
        self.node_name = ""
        self.operator_nodes: list[str] = []  # per CONSTANT, CALL and MUTATE line: the trace's operators
        self.backward_line = 0

    def _emit(self, **line) -> None:
        if line.get("ANNOTATION") == "BACKWARD":
            self.backward_line = len(self.lines)
        if line["INSTRUCTION"] in ("CALL", "MUTATE"):
            self.operator_nodes.append(self.node_name)
        elif line["INSTRUCTION"] == "CONSTANT":
            self.operator_nodes.append("")
        super()._emit(**line)
