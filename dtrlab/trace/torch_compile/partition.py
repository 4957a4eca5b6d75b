"""torch.compile's activation-memory knob, called rather than re-implemented: trace once, partition per knob.

``torch._functorch.config.activation_memory_budget`` (a ratio in [0, 1], default 1.0) steers
torch.compile's min-cut partitioner (``min_cut_rematerialization_partition``): below 1 it
runs a knapsack (``activation_memory_budget_solver``, "dp" by default) over the activations
it would otherwise save, weighing their bytes against the recompute cost its
``activation_memory_budget_runtime_estimator`` ("flops") assigns. This module asks torch's
own partitioner what it decides for each knob value and turns the answer into a dtrlab
:class:`~dtrlab.trace.model.Trace`.

API (stable; dtrlab.memory.partitioned and the knob census build on it)::

    joint = trace_joint("hf:llama", batch=1, seq=256, layers=4)   # once (tracing.py): dynamo + AOT autograd
    step = partition(joint, 0.05)                                  # per knob: torch's partitioner
    step.saved, step.recomputed, step.proxy_saved_bytes, step.trace
    partition(joint, 0.05, force={"mm_3": "recompute"})            # one node forced (its hooks)

    # dtrlab.memory.partitioned (the memory layer):
    knob_peaks(joint, 0.05)     # {knob, flat_peak, allocated_peak, reserved_peak, proxy_saved_bytes, ...}
    peak_composition(step)      # what is live at the peak: constants, saved, recomputed, backward
    interventions(joint, 0.05)  # one row per node forced saved / recomputed: its peak delta

* :func:`~dtrlab.trace.torch_compile.tracing.trace_joint` traces the training step once into the joint
  forward+backward graph torch.compile partitions (a
  :class:`~dtrlab.trace.torch_compile.joint.JointGraph`; one per graph for a step with graph breaks).
* :func:`partition` copies that joint graph and calls torch's
  ``min_cut_rematerialization_partition`` on the copy with the knob patched into
  ``torch._functorch.config`` (and the solver, optionally): no recompile. The forward and
  backward graphs it returns are run in order on meta tensors under the capture's recorder
  (:func:`~dtrlab.trace.torch_compile.record.record_partitioned`, which says what the trace is). The result
  is a :class:`PartitionedStep`.

Bad input (a knob outside [0, 1], a torch
without the knob, an unknown solver or node) raises ``ValueError`` with one line naming it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import fx

from ..model import Trace
from ..op_temporaries import temporaries_setting
from .gpu_target import device_answers
from .joint import KNOB, JointGraph, check_torch_has_knob, step_target
from .record import _output_nodes, record_partitioned

SOLVERS = ("dp", "greedy", "ilp", "dp_knapsack_sliding_hirschberg")
#: The partitioner's recompute cost estimators (torch/_functorch/partitioners.py:3401, ``estimate_runtime``;
#: "profile" benchmarks each operator on a GPU).
RUNTIME_ESTIMATORS = ("flops", "profile", "testing")
#: How a node is forced in :func:`partition`: torch's selective-checkpoint policies, the
#: partitioner's own hooks (``node.meta["recompute"]``).
FORCINGS = ("save", "recompute")


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
    operator count)``; None: run as aot_eager runs them (dtrlab.trace.torch_compile.inductor passes
    Inductor's lowering).
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
