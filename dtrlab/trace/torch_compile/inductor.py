"""The step's peak as Inductor executes it: Inductor's own lowering, scheduler and wrapper code, no kernels.

API::

    joint = trace_joint("hf:llama", layers=4, backend="inductor")   # Inductor's joint graph
    step = partition_lowered(joint, 0.05)   # torch's partitioner, then Inductor's lowering
    step.trace                               # allocations of Inductor's generated wrapper

Method, per knob value (:func:`partition_lowered`):

1. The joint graph is the one Inductor partitions: :func:`dtrlab.trace.torch_compile.tracing.trace_joint`
   with ``backend="inductor"`` runs ``torch.compile(backend="inductor")`` on fake tensors up
   to Inductor's partition function (its decompositions and joint-graph passes applied,
   torch/_inductor/compile_fx.py:2484) and keeps what it hands
   ``min_cut_rematerialization_partition(..., compiler="inductor")`` (:2506);
   :func:`~dtrlab.trace.torch_compile.partition.partition` calls that partitioner on a copy per knob.
2. Each of the forward and backward graphs goes through Inductor's own
   ``compile_fx_forward`` / ``compile_fx_backward`` (compile_fx.py:2621, :2774; the functions
   ``compile_fx``'s ``fw_compiler`` and ``bw_compiler`` call), on the compile's fake tensors
   and tracing context: post-grad passes, ``GraphLowering``, the ``Scheduler`` (fusion,
   buffer reuse, in-place buffers, ``reorder_for_peak_memory``) and the Python wrapper's
   code generation. Where Inductor would write and load that code
   (``GraphLowering._compile_to_module``, graph.py:3062, whose module load compiles the
   kernels through ``AsyncCompile``), the wrapper's source is taken instead: no kernel is
   compiled, no FX graph cache is read or written.
3. The wrapper module is executed with an ``AsyncCompile`` stand-in whose kernels do
   nothing, and its allocation helpers (codegen/wrapper.py:1638-1643: every
   ``empty_strided_<device>`` and ``reinterpret_tensor``, which allocate and view in C++, past the
   dispatcher) made to allocate and view through it, on the meta device; its checks (every ``assert_*``) are
   skipped but the output layout checks (``assert_size_stride``, ``assert_tensor_metadata``), which make the
   layout they name true on meta: a meta kernel may pick another memory format than the CPU kernel (the CPU
   convolution's channels-last output), same sizes and bytes, and the layout is what a later call's measured
   temporaries depend on (:mod:`dtrlab.trace.op_temporaries`). Its ``call`` then runs
   the forward, then the backward on the forward's saved outputs (boxed: ``call`` clears its argument
   list, as AOT autograd's runtime calls it), under the capture's recorder
   (:func:`dtrlab.trace.torch_compile.record.record_partitioned`). What comes out is Inductor's allocation
   sequence exactly as its wrapper executes it: a buffer lives from its ``empty_strided``
   to its ``del`` (wrapper.py:4442) or its last Python reference; a reused buffer
   (``buf3 = buf0; del buf0  # reuse``, ``make_buffer_reuse``, wrapper.py:4460) is the same
   storage under a new name, so it is allocated once; an in-place buffer is a kernel
   argument written in place and allocates nothing; extern kernels (``extern_kernels.mm(...,
   out=buf)``) and ATen fallbacks run their meta kernels on the recorder (fallbacks that
   name the CPU or CUDA device are moved to meta). The result is a dtrlab
   :class:`~dtrlab.trace.model.Trace`, so dtrlab.memory.partitioned's flat, allocated and
   reserved accountings apply unchanged.

A step with graph breaks (``joint.parts``, each graph's joint the one Inductor partitions, with its own
compile's capture): each graph's partition is lowered with its own capture, and the wrappers run graph by
graph as :func:`dtrlab.trace.torch_compile.record.run_parts` runs aot_eager's graphs (the tensors handed from graph to
graph, the backwards in reverse order).

Lowering is the cost (seconds per graph); many knob values give the same partition, so
each distinct pair of graphs (by content, and the Inductor configuration) is lowered once
per joint graph (``joint.lowerings``), and what the accounting reads from a lowered step (its
trace, recorded peak and forward operator count) is kept on disk across runs
(:mod:`dtrlab.trace.torch_compile.lowering_cache`, keyed by :func:`disk_key`; ``cache=False`` lowers afresh).

The trace's operators are the wrapper's allocations, views and extern/fallback calls; the
fused kernels are absent (they allocate nothing), so its FLOP costs are not a compute
model, and its node names are empty. Not modelled: kernels' scratch memory (a C++ kernel's
stack and thread-local buffers), the CPU allocator's own overhead.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import weakref
from collections.abc import Iterator

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

from ..op_temporaries import temporaries_setting
from . import lowering_cache
from .intercept import _first_line
from .joint import JointGraph, joint_device, joint_hash, step_target
from .partition import PartitionedStep, partition
from .record import RECORDING_VERSION, record_partitioned


class InductorLoweringError(ValueError):
    """Inductor could not lower a partitioned graph (one line, naming the graph and the cause)."""


def partition_lowered(joint: JointGraph, knob: float, *, solver: str | None = None,
                      force: dict[str, str] | None = None, cache=True,
                      temporaries: bool | None = None) -> PartitionedStep:
    """torch's partition of Inductor's joint graph at ``knob``, its trace the allocations of Inductor's wrapper.

    ``joint`` must come from ``trace_joint(..., backend="inductor")``; ``solver`` and
    ``force`` are :func:`~dtrlab.trace.torch_compile.partition.partition`'s. ``cache``: where lowered steps are kept
    across runs (:func:`dtrlab.trace.torch_compile.lowering_cache.lowering_directory`: True for ``$DTRLAB_CACHE``, a
    directory, or False to lower afresh and keep nothing; the operators' measured temporaries are kept there too).
    ``temporaries``: the extern and fallback calls that allocate inside (convolutions) get their measured
    temporaries (:mod:`dtrlab.trace.op_temporaries`); None: on for a CPU target, off for a GPU's.
    """
    _check_inductor_joint(joint)
    record = functools.partial(record_lowered, cache=cache,
                               temporaries=temporaries_setting(temporaries, step_target(joint)))
    return partition(joint, knob, solver=solver, force=force, record_with=record)


def _check_inductor_joint(joint: JointGraph) -> None:
    if joint.backend != "inductor" or any(part.inductor is None for part in joint.parts or (joint,)):
        raise ValueError(f"{joint.source}: the Inductor accounting needs the joint graph Inductor partitions: "
                         "trace it with backend='inductor'")


def record_lowered(pairs: tuple, joint: JointGraph, cache=True, temporaries: str | None = None):
    """:func:`~dtrlab.trace.torch_compile.partition.partition`'s ``record_with`` for Inductor: lower each graph's
    forward and backward (:func:`_lowered_calls`), run the wrappers.

    Keyed by the graphs' content and Inductor's configuration: a partition met before (at
    another knob value) is not lowered or run again; one met in an earlier run is read from the
    disk cache (``cache``, :func:`partition_lowered`'s), which a new lowering writes. ``temporaries``:
    :func:`~dtrlab.trace.torch_compile.record.record_partitioned`'s, part of both keys.
    """
    keys = _memo_keys(pairs, temporaries)
    if keys not in joint.lowered_records:
        path = lowering_cache.entry_path(cache, disk_key(joint, keys))
        name, source = joint.source, f"<{joint.source} partitioned>"  # as record_partitioned names the trace
        record = lowering_cache.load_record(path, path.stem, name, source) if path is not None else None
        if record is None:
            calls = tuple(_lowered_calls(forward, backward, part, key)
                          for (forward, backward), part, key in zip(pairs, joint.parts or (joint,), keys[:-1]))
            record = record_partitioned(pairs, joint, calls, temporaries, cache)
            if path is not None:
                lowering_cache.store_record(path, path.stem, record)
        joint.lowered_records[keys] = record
    return joint.lowered_records[keys]


def _memo_keys(pairs: tuple, temporaries: str | None) -> tuple:
    """A step's lowerings in this process's memo: per graph, its forward's and backward's keys and the configuration's;
    last, the operators' temporaries' setting (:func:`record_lowered`'s)."""
    config = _config_key()
    return (*((graph_key(forward), graph_key(backward), config) for forward, backward in pairs), temporaries)


class _Keyed(Exception):
    """Stops :func:`~dtrlab.trace.torch_compile.partition.partition` once the partition's disk key is known."""


def lowering_key(joint: JointGraph, knob: float, *, solver: str | None = None,
                 force: dict[str, str] | None = None, temporaries: bool | None = None) -> str:
    """The disk key of the step :func:`partition_lowered` would lower at ``knob``: torch's partition, nothing
    lowered. Knob values with equal keys share one lowering (a parallel census lowers each key once)."""
    _check_inductor_joint(joint)
    setting = temporaries_setting(temporaries, step_target(joint))

    def keyed(pairs: tuple, joint: JointGraph):
        raise _Keyed(disk_key(joint, _memo_keys(pairs, setting)))

    try:
        partition(joint, knob, solver=solver, force=force, record_with=keyed)
    except _Keyed as found:
        return found.args[0]
    raise AssertionError("partition returned without recording its step")


def disk_key(joint: JointGraph, keys: tuple) -> str:
    """A lowered step's key across processes and runs: its graphs' keys (``keys``: :func:`_memo_keys`, which hold
    Inductor's configuration), the joint graph they were partitioned from
    (:func:`~dtrlab.trace.torch_compile.joint.joint_hash`: its nodes and placeholders' shapes, strides and dtypes,
    which the graphs' keys do not hold), AOT autograd's
    configuration but the partitioner's knob settings (it decides which saved tensors the backward may reuse), the
    device Inductor lowers for (:func:`lowering_target`), torch's version, the rules a step is recorded by and the
    stored record's format."""
    import torch._functorch.config as functorch_config

    functorch = sorted((name, value) for name, value in functorch_config.get_config_copy().items()
                       if not name.startswith("activation_memory_budget"))  # the partition is in the graphs
    content = (lowering_cache.LOWERING_VERSION, torch.__version__, RECORDING_VERSION, lowering_target(joint),
               _joint_digest(joint), repr(functorch), keys)
    return hashlib.sha256(repr(content).encode()).hexdigest()


def lowering_target(joint: JointGraph) -> str:
    """The device Inductor lowers for: the device type(s) of the joint graph's inputs (``cpu``)."""
    return joint_device(joint)


#: :func:`~dtrlab.trace.torch_compile.joint.joint_hash` per joint graph object (id -> (weak reference, digest)):
#: computed once per joint, not per knob. A frozen JointGraph compares by its source and options, not its graph, so it
#: is not a key itself.
_JOINT_DIGESTS: dict[int, tuple] = {}


def _joint_digest(joint: JointGraph) -> str:
    known = _JOINT_DIGESTS.get(id(joint))
    if known is None or known[0]() is not joint:
        known = (weakref.ref(joint, lambda _, key=id(joint): _JOINT_DIGESTS.pop(key, None)), joint_hash(joint))
        _JOINT_DIGESTS[id(joint)] = known
    return known[1]


def _lowered_calls(forward: fx.GraphModule, backward: fx.GraphModule, part: JointGraph, key: tuple):
    """One graph's forward and backward wrappers (:func:`_wrapper_call`), lowered once per distinct pair (``key``,
    in ``part.lowerings``)."""
    memo = part.lowerings
    if key not in memo:
        _categorize_saved_tensors(forward, backward, part)
        lowered_forward = lower(forward, part, backward=False)
        # The strides Inductor gave the forward's outputs are those the backward is compiled for.
        outputs = forward.graph.find_nodes(op="output")[0].args[0]
        strides = {node.name: stride for node, stride in zip(outputs, lowered_forward[2]) if isinstance(node, fx.Node)}
        lowered_backward = lower(backward, part, backward=True, input_strides=strides)
        memo[key] = (lowered_forward, lowered_backward)
    # The memo keeps what Inductor generated; each step run loads its own wrapper modules.
    return tuple(_wrapper_call(lowered) for lowered in memo[key])


def _categorize_saved_tensors(forward: fx.GraphModule, backward: fx.GraphModule, joint: JointGraph) -> None:
    """AOT autograd's bookkeeping of the partition's saved tensors, on the step's metadata, by AOT's own function.

    After partitioning, AOT autograd counts the saved tensors and, when
    ``torch._functorch.config.donated_buffer`` is on, names the saved tensors the backward
    may reuse (``fw_metadata.bw_donated_idxs``: ``_categorize_saved_tensors_for_backward``,
    torch/_functorch/_aot_autograd/graph_compile.py:2006-2084). ``GraphLowering`` reads
    them (torch/_inductor/graph.py:624, :1362) and may then write a backward buffer into a
    saved tensor it no longer needs (``buf1 = addmm_7; del addmm_7  # reuse``).
    """
    from torch._functorch._aot_autograd.graph_compile import _categorize_saved_tensors_for_backward

    metadata = joint.inductor.fw_metadata
    if metadata is not None:
        _categorize_saved_tensors_for_backward(forward, backward, metadata, metadata, joint.num_fwd_outputs)


def graph_key(graph_module: fx.GraphModule) -> str:
    """A digest of a graph's nodes (names, operators, arguments): equal graphs, equal keys."""
    digest = hashlib.sha256()
    for node in graph_module.graph.nodes:
        digest.update(repr((node.op, node.name, str(node.target), node.args, node.kwargs)).encode())
    return digest.hexdigest()


def _config_key() -> str:
    from torch._inductor import config

    return hashlib.sha256(repr(sorted(config.get_config_copy().items())).encode()).hexdigest()


class _Lowered(Exception):
    """Stops Inductor's compile once the wrapper's source is generated."""


def lower(graph_module: fx.GraphModule, joint: JointGraph, *, backward: bool,
          input_strides: dict | None = None) -> tuple[str, dict, list]:
    """Inductor's wrapper module for one partitioned graph: its Python source, its constants, its outputs' strides.

    Runs ``compile_fx_forward`` / ``compile_fx_backward`` on a copy of the graph, with the
    fake tensors and tracing context of the compile that traced ``joint``, and takes the
    source where ``GraphLowering._compile_to_module`` would load it (see the module docstring).
    ``input_strides``: strides by placeholder name (the forward's outputs' strides, for the
    backward): a placeholder whose fake value has other strides is restrided to them, as AOT
    autograd restrides the backward's inputs to what the compiled forward returned
    (torch/_functorch/_aot_autograd/graph_compile.py:2326-2394). The output strides are
    Inductor's layouts of the graph's outputs, read as ``fx_codegen_and_compile`` reads them
    (torch/_inductor/compile_fx.py:1661-1677).
    """
    from torch._inductor import compile_fx, config
    from torch._inductor.graph import GraphLowering

    capture = joint.inductor
    graph_module = copy.deepcopy(graph_module)  # Inductor's post-grad passes rewrite the graph in place
    example_inputs = [_restrided(node.meta["val"], (input_strides or {}).get(node.name), capture.fake_mode)
                      for node in graph_module.graph.find_nodes(op="placeholder")]
    lowered: dict = {}

    def source_only(self):
        from torch._inductor.ir import IRNode

        strides = [tuple(int(s) for s in out.get_layout().stride)
                   if isinstance(out, IRNode) and out.has_tensor_output() else None for out in self.graph_outputs]
        wrapper_code, _ = self.codegen()
        lowered.update(source=wrapper_code.value, constants={**self.constants, **self.torchbind_constants},
                       strides=strides)
        raise _Lowered

    # Inductor takes its fake mode from the tracing context (torch/_guards.py's detect_fake_mode). The real compile
    # shares one CompilerConfigExtra between forward and backward; what its boxes carry across is CUDA graphs'.
    # One compile thread: with a warm worker pool, Triton's define_kernel sends each kernel to be compiled as it is
    # generated (torch/_inductor/codegen/triton.py:8166-8170, AsyncCompile.use_process_pool), ptxas included, though
    # nothing here ever runs it; the thread count decides nothing else in the lowering (async_compile.py:379-394).
    extra = compile_fx.create_compiler_config_extra(capture.dynamo_graph)
    with config.patch(fx_graph_cache=False, compile_threads=1), \
            _patched(GraphLowering, "compile_to_module", source_only), \
            torch._guards.tracing(capture.tracing_context), \
            _patched(capture.tracing_context, "fw_metadata", capture.fw_metadata):
        try:
            if backward:
                compile_fx.compile_fx_backward(graph_module, example_inputs, compiler_config_extra=extra)
            else:
                dynamo_graph = capture.dynamo_graph
                compile_fx.compile_fx_forward(
                    graph_module, example_inputs,
                    num_orig_model_outputs=compile_fx.get_num_model_outputs(dynamo_graph),
                    num_example_inputs=len(dynamo_graph.graph.find_nodes(op="placeholder")),
                    compiler_config_extra=extra)
        except Exception as exc:  # Inductor wraps what compile_to_module raised
            if "source" not in lowered:
                phase = "backward" if backward else "forward"
                raise InductorLoweringError(f"{joint.source}: Inductor cannot lower the {phase} graph: "
                                            f"{type(exc).__name__}: {_first_line(exc)}") from exc
    return lowered["source"], lowered["constants"], lowered["strides"]


def _restrided(value, stride, fake_mode):
    if stride is None or not isinstance(value, torch.Tensor) or tuple(value.stride()) == tuple(stride):
        return value
    with fake_mode:
        return value.as_strided(value.size(), stride)


@contextlib.contextmanager
def _patched(owner, name: str, value) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _no_kernel(*args, **kwargs) -> None:
    """A compiled kernel's stand-in: kernels write into buffers the wrapper allocated; they allocate nothing."""


_no_kernel.run = _no_kernel  # a CUDA wrapper launches a Triton kernel by its run method (``triton_poi_fused_0.run``)


class _NoKernels:
    """Inductor's ``AsyncCompile`` while the wrapper module loads: every kernel it would compile is a no-op."""

    def __getattr__(self, name: str):  # cpp_pybinding, cpp, triton, multi_kernel, ...
        return lambda *args, **kwargs: _no_kernel

    def wait(self, scope) -> None:
        pass


def _dispatched_empty_strided(size, stride, dtype=None, *_, **__) -> torch.Tensor:
    """A wrapper's allocation (``empty_strided_cpu(size, stride, dtype)``, ``empty_strided_cuda``, ...) through the
    dispatcher, where the recorder sees it and :class:`_MetaDevices` moves it to meta: Inductor's own helpers
    allocate in C++, past both (codegen/wrapper.py:1638-1642). Their device arguments are left to that move."""
    return torch.empty_strided(size, stride, dtype=dtype)


def _dispatched_reinterpret(base: torch.Tensor, size, stride, offset_increment) -> torch.Tensor:
    """``reinterpret_tensor`` through the dispatcher (``as_strided``), so the recorder sees the view of ``base``.
    Inductor's offset adds to ``base``'s own (``_reinterpret_tensor``, torch/csrc/inductor/inductor_ops.cpp)."""
    return torch.as_strided(base, size, stride, base.storage_offset() + offset_increment)


def _wrapper_call(lowered: tuple[str, dict, list]):
    """The wrapper module's ``call``, loaded with no kernels and meta-device allocations (module docstring, 3):
    every allocation helper it defines (``empty_strided_<device>``) allocates through the dispatcher, every check
    is skipped but the layout checks (:func:`_asserted_layout`)."""
    from torch._inductor import async_compile

    source, constants, _ = lowered
    namespace: dict = {"__name__": "dtrlab_inductor_wrapper"}
    with _patched(async_compile, "AsyncCompile", _NoKernels):
        exec(compile(source, "<inductor wrapper>", "exec"), namespace)  # noqa: S102 - Inductor's generated code
    namespace.update({name: _meta_like(value) for name, value in constants.items()})
    namespace.update({name: _dispatched_empty_strided for name in namespace if name.startswith("empty_strided")})
    namespace.update({name: _no_kernel for name in namespace if name.startswith("assert_")})
    namespace.update(assert_size_stride=_asserted_layout, assert_tensor_metadata=_asserted_layout)
    namespace["reinterpret_tensor"] = _dispatched_reinterpret
    call = namespace["call"]

    def run(arguments: list) -> tuple:
        with _MetaDevices():
            return call(arguments)

    return run


def _asserted_layout(tensor, size, stride, *_, **__) -> None:
    """A wrapper's check of an extern kernel's output layout (``assert_tensor_metadata(buf1, size, stride, ...)``,
    ``assert_size_stride``), made true on meta: the real kernel returns that layout (the CPU convolution's
    channels-last output of a channels-last input), its meta kernel may not, and what the output is handed to
    next (a convolution's backward, whose temporaries depend on its arguments' layouts) must see the real one."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta" and tuple(tensor.shape) == tuple(size) \
            and tuple(tensor.stride()) != tuple(stride):
        with torch.utils._python_dispatch._disable_current_modes():
            tensor.as_strided_(size, stride)


def _meta_like(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="meta")
    return value


class _MetaDevices(TorchDispatchMode):
    """Above the recorder while a wrapper runs: devices an operator names (an ATen fallback's
    ``device=cpu``) become meta, and an operator that only writes into buffers it is given
    (``extern_kernels.mm(..., out=buf)``, an in-place fallback) runs below the recorder: it
    allocates nothing, and the log's ``MUTATE`` (a fresh storage replacing the written one,
    simrd's semantics of a mutation) would count the buffer twice."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def moved(value):
            return torch.device("meta") if isinstance(value, torch.device) else value

        args, kwargs = tuple(map(moved, args)), {key: moved(value) for key, value in (kwargs or {}).items()}
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and r.alias_info.is_write for r in returns):
            with torch.utils._python_dispatch._disable_current_modes():
                return func(*args, **kwargs)
        return func(*args, **kwargs)
