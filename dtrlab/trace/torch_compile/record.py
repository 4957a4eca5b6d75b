"""The partitioned step recorded: its graphs run on meta tensors under the capture's recorder, a dtrlab trace.

The forward and backward graphs :func:`~dtrlab.trace.torch_compile.partition.partition` returns are run in
order on meta tensors under the capture's recorder
(:class:`dtrlab.trace.capture.Recorder`, the code that records ``dtrlab capture``'s logs:
same operator names, sizes, aliasing, release points and cost models), run as aot_eager
runs them (boxed calls: each graph frees its inputs and intermediates after their last
use); saved tensors are handed from the forward's outputs to the backward, so a saved view
keeps its base's storage, as in the real step (:func:`run_graphs`; a step with graph breaks: :func:`run_parts`).

What the trace is: the forward graph's operators, then the backward graph's (the
recomputed forward operators among them, where the partitioner put them). Constants: the
forward graph's inputs (parameters, buffers, inputs and the tensors dynamo lifted, such as
the loss's targets) and the backward's tangent (the loss's gradient, a scalar); they live
through the whole step. The forward's outputs other than the loss are the saved tensors:
each lives until its last use in the backward. The backward's outputs (the gradients) live
to the end of the step. Not modelled here: Inductor's lowering (fusion, reordering and
buffer reuse: the graphs run node by node, as aot_eager runs them; dtrlab.trace.torch_compile.inductor
lowers them as Inductor does, running its wrappers through :func:`record_partitioned`), the optimizer step, and
autograd's own small tensors outside the graphs.
"""

from __future__ import annotations

import gc

import torch
# Importing dynamo while the recorder's dispatch mode is active would keep that frame's
# tensors alive for good (see dtrlab.trace.capture): import it first.
import torch._dynamo  # noqa: F401
from torch import fx

from ..capture import Recorder
from ..model import Trace
from ..op_temporaries import OpTemporaries
from ..simrd_log import parse_lines
from .joint import JointGraph, StepLinks

#: The rules a partitioned step is recorded by, in the keys of answers cached from its peaks (dtrlab.compile's):
#: a change that moves a recorded step's memory bumps it. 2 (4 December 2026): a tensor's gradients from two
#: graphs summed in place, as autograd sums them (:func:`_add_gradients`); graph outputs held until the last
#: graph's forward has run (:func:`run_parts`); a one-graph step's loss gradient of the loss's dtype. 3 (6 December
#: 2026): operators' measured temporaries (dtrlab.trace.op_temporaries), on by default for a CPU target.
RECORDING_VERSION = 3


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
