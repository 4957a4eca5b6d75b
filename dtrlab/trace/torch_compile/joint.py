"""The joint graph: a training step's forward+backward graph as AOT autograd hands it to torch.compile's partitioner.

:class:`JointGraph` is what :func:`~dtrlab.trace.torch_compile.tracing.trace_joint` keeps (once per step) and
what every later step takes: :func:`~dtrlab.trace.torch_compile.partition.partition` partitions a copy per knob,
:mod:`dtrlab.trace.torch_compile.inductor` lowers the partitions. A step with graph breaks is one JointGraph per
compiled graph (``parts``), linked by :class:`StepLinks`; a step traced for Inductor keeps what Inductor's compile
held (:class:`InductorCapture`). Here too: the checks of the knob's presence and of the backend, the graph's
content hash (:func:`joint_hash`) and the device it targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx

KNOB = "activation_memory_budget"
#: The torch.compile backends whose joint graph :func:`~dtrlab.trace.torch_compile.tracing.trace_joint` keeps:
#: Inductor's (its decompositions and joint-graph passes, what ``torch.compile``'s default backend partitions) and
#: aot_eager's.
BACKENDS = ("inductor", "aot_eager")


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
    #: torch's ``solve_min_cut`` answers on this graph, by node names (see
    #: :func:`~dtrlab.trace.torch_compile.partition.partition`'s ``reuse_min_cuts``).
    min_cuts: dict = field(default_factory=dict, compare=False, repr=False)
    #: A step with graph breaks: one single-graph JointGraph per compiled-graph call, in execution order
    #: (empty for a one-graph step, whose graph is this one's). See :class:`StepLinks`.
    parts: tuple = field(default=(), compare=False, repr=False)
    links: StepLinks | None = field(default=None, compare=False, repr=False)
    #: The torch.compile backend whose joint graph this is (see :data:`BACKENDS`).
    backend: str = "aot_eager"
    #: Inductor's: what its compile held when it partitioned (:class:`InductorCapture`), for lowering later.
    inductor: InductorCapture | None = field(default=None, compare=False, repr=False)
    #: Lowered partitions by content (dtrlab.trace.torch_compile.inductor): many knob values give the same graphs. For a
    #: step with graph breaks, each graph's lowerings are its part's.
    lowerings: dict = field(default_factory=dict, compare=False, repr=False)
    #: The lowered step's records by its graphs' content (dtrlab.trace.torch_compile.inductor).
    lowered_records: dict = field(default_factory=dict, compare=False, repr=False)
    #: The GPU the graph was re-traced for (dtrlab.trace.torch_compile.cuda_joint: a
    #: :data:`~dtrlab.trace.torch_compile.gpu_target.GPU_TARGETS` name; partitioned and lowered under its answers),
    #: or None: the device its fake tensors claim answers itself.
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


def check_torch_has_knob() -> None:
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, KNOB):
        raise ValueError(f"torch {torch.__version__} has no torch._functorch.config.{KNOB} "
                         "(torch.compile's activation memory budget, added in torch 2.4)")


def check_backend(backend) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else a one-line ValueError naming the option."""
    from ...suggest import did_you_mean

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}"
                         f"{did_you_mean(str(backend), list(BACKENDS))}")
    return backend


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


def _joint_graph(source: str, build_options: tuple, kept: dict, desc: str, backend: str) -> JointGraph:
    graph_module = kept["graph_module"]
    return JointGraph(
        source=source, build_options=build_options, graph_module=graph_module,
        joint_inputs=tuple(kept["joint_inputs"]), num_fwd_outputs=kept["num_fwd_outputs"],
        static_lifetime_input_indices=tuple(kept.get("static_lifetime_input_indices") or ()),
        forward_nodes=_forward_nodes(graph_module.graph), torch_version=torch.__version__, desc=desc,
        backend=backend, inductor=kept.get("inductor"))


def _forward_nodes(graph: fx.Graph) -> frozenset[str]:
    """Operator nodes that do not depend on a tangent: the forward part of the joint graph."""
    backward: set[fx.Node] = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and node.name.startswith("tangents")) or \
                any(arg in backward for arg in node.all_input_nodes):
            backward.add(node)
    return frozenset(node.name for node in graph.nodes if node.op == "call_function" and node not in backward)
