"""torch.compile run up to its partition function, which keeps the joint graph it is handed and stops the compile.

aot_eager's way: ``torch.compile(fullgraph=True)`` with an ``aot_autograd`` backend whose partition function is
the keeper (:func:`_one_graph`). Inductor's way: its ``compile_fx`` with the partitioner it calls replaced by the
keeper, after its decompositions and joint-graph passes (:func:`_inductor_partition_kept`,
:func:`_inductor_joint`), what lowering needs kept beside it
(:class:`~dtrlab.trace.torch_compile.joint.InductorCapture`). A step that does not fit one graph goes on in
:mod:`dtrlab.trace.torch_compile.graph_breaks`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import fx, nn

from .joint import InductorCapture


class _JointCaptured(Exception):
    """Raised by the capturing partition function to stop the compile once the joint graph is kept."""


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


def _identity_compiler(graph_module, example_inputs):
    return graph_module


def _untraceable(source: str, exc: BaseException) -> ValueError:
    from ..models import ModelSourceError

    cause = getattr(exc, "inner_exception", None) or exc  # what the backend itself raised
    # The error at the chain's root: dynamo raises its own (TorchRuntimeError: "RuntimeError when making fake tensor
    # call") while handling the operator's, which says what is wrong.
    while (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    return ModelSourceError(f"{source}: torch.compile cannot trace its training step: "
                            f"{type(cause).__name__}: {_first_line(cause)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
