"""A step with graph breaks: each graph's joint, and how the graphs hand tensors to one another.

torch.compile runs the step on the fake tensors (aot_autograd's backend, torch's partitioner at knob 1.0), each
graph's joint graph kept as AOT autograd hands it to the partitioner (under Inductor, as Inductor's partition
function is handed it), and each graph call's input and output tensors noted: from them,
:class:`~dtrlab.trace.torch_compile.joint.StepLinks` (which earlier output or input each graph's input is, which
outputs get a gradient, where the loss is).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .intercept import _identity_compiler, _inductor_joint, _untraceable
from .joint import JointGraph, StepLinks, _joint_graph


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
