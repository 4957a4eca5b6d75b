"""Record one training step of a PyTorch module as a simrd-format DTR log.

``record(module, inputs)`` runs forward, backward and optionally an optimizer step
under a :class:`~torch.utils._python_dispatch.TorchDispatchMode` and writes one log
instruction per event, in simrd's JSON-lines format (the DTR artifact's format):

* parameters, buffers and inputs become ``CONSTANT`` + ``MEMORY`` then ``COPY`` to the
  name the step uses, and ``RELEASE`` of the constant's own name (as the artifact does);
  tensors first met inside the step without having been produced by a recorded
  operator (e.g. ``torch.tensor(...)`` data, optimizer state) become constants too;
* an operator call becomes ``CALL`` followed by one ``MEMORY`` and one ``ALIAS`` line
  per tensor result.  A result that shares a storage with an argument is an alias:
  size 0 and the argument's index; otherwise its size is the bytes of its storage;
* an operator that writes to an argument (per its schema) becomes ``MUTATE`` with the
  indices of the written arguments;
* ``RELEASE`` is written when the last reference to a tensor goes away (a weakref
  finalizer on the Python tensor; PyTorch keeps that object alive for as long as C++
  holds the tensor);
* ``ANNOTATE START`` precedes the step and ``ANNOTATE BACKWARD`` the backward pass.

Autograd saves for backward the very tensors the dispatcher returned, so a saved
tensor keeps its name until autograd frees it.  Should a storage outlive every
tensor the log knows on it, the two peaks below would disagree; the tests check that
they do not.

Independently of the log, the recorder accounts the bytes of live storages (a
finalizer on each storage object) and reports their peak, which a replay of the log
without a memory budget should reproduce. It also accounts the bytes no budget can
evict (:attr:`Recording.pinned_bytes`): the constants' storages (parameters, buffers,
inputs, optimizer state), which simrd pins while they live, and at the step's end
every storage still live (the outputs, which the replay pins then). Below
``pinned_bytes / peak_live_bytes`` of the peak DTR has nothing to evict and fails.

Costs are either median wall time in nanoseconds over ``repeats`` runs of each
operator (``cost="time"``, the artifact's unit), FLOPs (``cost="flops"``):
``torch.utils.flop_counter``'s formulas for matmuls, convolutions and attention, and
one FLOP per output element for every other operator that allocates or writes, or a
GPU roofline time (``cost="roofline:A100"`` etc., see :mod:`dtrlab.trace.costs`).
FLOP and roofline traces are deterministic: the same model and torch version give
the same log.

A model whose parameters and inputs are on the meta device is recorded without
any data: every operator runs its meta kernel, sizes come from the meta storages'
byte counts, and memory does not grow with the model (``dtrlab capture`` records
this way unless ``--real``). On the zoo models the meta-device log is identical to
the real-tensor log (tests/test_capture.py). FakeTensorMode was tried first and
gives the same operators and sizes, but its view tensors keep their base's Python
object alive, which moves some RELEASE lines later than with real tensors.

This module imports torch; the rest of dtrlab does not.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import statistics
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
# The dispatch mode's first use imports torch._dynamo lazily, and that import keeps
# the Python frames active at that moment alive (with the tensors in their locals)
# for good. Importing it here keeps it out of the recorded step.
import torch._dynamo  # noqa: F401
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..progress import progress_bar
from .costs import check_cost_model, roofline_gpu, roofline_ns

_HALF_DTYPES = (torch.float16, torch.bfloat16)
# Matmul-class kernels that torch.utils.flop_counter does not know: the CPU flash
# attention that scaled_dot_product_attention runs on the CPU, and on the meta device
# in dtrlab.trace.models (the formulas are its CUDA twin's), and the grouped matmul of
# mixture-of-experts layers (every row meets one group's matrix: 2 x rows x K x N).
_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *args, **kwargs: sdpa_flop_count(q.shape, k.shape, v.shape),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda grad, q, k, v, *args, **kwargs: sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape),
    torch.ops.aten._grouped_mm:
        lambda a, b, *args, **kwargs: 2 * a.numel() * b.shape[-1] // (a.shape[0] if a.dim() == 3 and b.dim() == 2
                                                                       else 1),
}

# Operators whose schema does not declare a write they perform: (op, argument names).
# native_batch_norm updates running_mean/running_var in place when training.
_UNDECLARED_WRITES = {
    torch.ops.aten.native_batch_norm.default: ("running_mean", "running_var"),
}


@dataclass
class Recording:
    """A recorded step: the log instructions plus what was measured while recording."""

    lines: list[dict]
    #: Peak bytes of live tensor storages during the step, measured from storage
    #: lifetimes (independently of the log's RELEASE lines).
    peak_live_bytes: int
    meta: dict = field(default_factory=dict)
    #: The most bytes pinned at once: constants' storages while they live, and every
    #: storage live at the step's end (the outputs). No budget below it can pass.
    pinned_bytes: int = 0

    @property
    def pinned_fraction(self) -> float:
        """``pinned_bytes`` over the peak: the budget ratio below which DTR has nothing to evict."""
        return self.pinned_bytes / self.peak_live_bytes if self.peak_live_bytes else 0.0

    @property
    def op_count(self) -> int:
        """Number of CALL and MUTATE instructions."""
        return sum(1 for line in self.lines if line["INSTRUCTION"] in ("CALL", "MUTATE"))

    def to_jsonl(self) -> str:
        # Sorted keys and no spaces, exactly as the artifact's logs are written.
        return "".join(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n" for line in self.lines)

    def write(self, path: str | Path) -> Path:
        """Write the log; gzip-compressed (reproducibly: mtime 0) if the name ends in .gz."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_jsonl().encode()
        if path.suffix == ".gz":
            with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                gz.write(data)
        else:
            path.write_bytes(data)
        return path


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


#: The progress bar's guess at the backward pass's operators, in forward operators (1.35 on the zoo's
#: ResNet-32; more for attention and recurrent models).
BACKWARD_ESTIMATE = 1.5


#: The kinds of allocation a recording gives a call's measured temporaries, each named ``<op>_<kind>``: ``held``
#: (kept to the step's end) and ``temporary`` (freed once the call has run).
TEMPORARY_KINDS = ("held", "temporary")


def is_measured_temporary(op_name: str) -> bool:
    """Whether an operator of a recorded trace is a call's measured temporary rather than a tensor of the step."""
    return op_name.endswith(tuple(f"_{kind}" for kind in TEMPORARY_KINDS))


class Recorder(TorchDispatchMode):
    """Dispatch mode that turns every ATen call into log instructions."""

    def __init__(self, cost: str, repeats: int, temporaries: Callable | None = None):
        super().__init__()
        #: What an operator call allocates inside, ``(func, args, kwargs) -> Temporaries | None``
        #: (:class:`dtrlab.trace.op_temporaries.OpTemporaries`); None: nothing.
        self.temporaries = temporaries
        self._held_temporaries: list[torch.Tensor] = []  # live to the step's end, as what a kernel cached
        self.cost = check_cost_model(cost)
        self.gpu = roofline_gpu(cost)
        self.repeats = max(1, repeats)
        self.lines: list[dict] = []
        self.closed = False
        self._next_name = 0
        self._names: dict[int, list[str]] = {}  # id(tensor) -> its live log names
        self._tensor_finalizers: dict[int, weakref.finalize] = {}
        self._pending_releases: list[str] = []  # finalizers may run mid-instruction; flushed at safe points
        self._storage_names: dict[int, dict[str, None]] = {}  # storage key -> live names on it
        self._name_storage: dict[str, int] = {}
        # Independent accounting of live storage bytes.
        self._live_storages: dict[int, int] = {}  # storage key -> bytes
        self._constant_storages: set[int] = set()
        self._storage_finalizers: list[weakref.finalize] = []
        self.live_bytes = 0
        self.peak_live_bytes = 0
        self.constant_bytes = 0  # live bytes of constants' storages (pinned)
        self.pinned_bytes = 0
        self.skipped_ops: dict[str, int] = {}
        self.bar = None  # record()'s progress bar, if any

    # -- names and lifetimes -------------------------------------------------------

    def _fresh(self) -> str:
        name = f"x{self._next_name}"
        self._next_name += 1
        return name

    def _emit(self, **line) -> None:
        self.lines.append(line)

    def _bind(self, t: torch.Tensor, name: str) -> None:
        key = id(t)
        if key not in self._names:
            self._names[key] = []
            self._tensor_finalizers[key] = weakref.finalize(t, self._on_tensor_death, key)
        self._names[key].append(name)
        storage = _storage_key(t)
        self._storage_names.setdefault(storage, {})[name] = None
        self._name_storage[name] = storage

    def _on_tensor_death(self, key: int) -> None:
        if self.closed:
            return
        del self._tensor_finalizers[key]
        for name in self._names.pop(key):
            self._pending_releases.append(name)
            storage = self._name_storage.pop(name)
            names = self._storage_names[storage]
            del names[name]
            if not names:
                del self._storage_names[storage]

    def flush_releases(self) -> None:
        while self._pending_releases:
            self._emit(INSTRUCTION="RELEASE", NAME=self._pending_releases.pop(0))

    def _track_storage(self, t: torch.Tensor, constant: bool = False) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live_storages:
            return
        self._live_storages[key] = storage.nbytes()
        self._storage_finalizers.append(weakref.finalize(storage, self._on_storage_death, key))
        self.live_bytes += storage.nbytes()
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        if constant:
            self._constant_storages.add(key)
            self.constant_bytes += storage.nbytes()
            self.pinned_bytes = max(self.pinned_bytes, self.constant_bytes)

    def _on_storage_death(self, key: int) -> None:
        if not self.closed:
            size = self._live_storages.pop(key)
            self.live_bytes -= size
            if key in self._constant_storages:
                self._constant_storages.remove(key)
                self.constant_bytes -= size

    def name_of(self, t: torch.Tensor) -> str:
        """The tensor's log name, declaring it first if the log has not met it yet."""
        names = self._names.get(id(t))
        if names:
            return names[0]
        existing = self._storage_names.get(_storage_key(t))
        if existing:
            # A view made outside the dispatcher (e.g. ``.data``) of a known storage.
            source = next(iter(existing))
            name = self._fresh()
            self._emit(INSTRUCTION="CALL", NAME="untracked_alias", ARGS=[source], RESULT=[name], TIME="0")
            self._emit(INSTRUCTION="MEMORY", NAME=name, MEMORY="0")
            self._emit(INSTRUCTION="ALIAS", NAME=name, ALIAS="0")
        else:
            constant, name = self._fresh(), self._fresh()
            self._track_storage(t, constant=True)
            self._emit(INSTRUCTION="CONSTANT", NAME=constant)
            self._emit(INSTRUCTION="MEMORY", NAME=constant, MEMORY=str(t.untyped_storage().nbytes()))
            self._emit(INSTRUCTION="COPY", DST=name, SRC=constant)
            self._emit(INSTRUCTION="RELEASE", NAME=constant)
        self._bind(t, name)
        return name

    def close(self) -> None:
        """Stop logging; tensors that die from now on are not part of the step."""
        self.flush_releases()
        self.pinned_bytes = max(self.pinned_bytes, self.live_bytes)  # the outputs, pinned at the end
        self.closed = True
        for finalizer in list(self._tensor_finalizers.values()) + self._storage_finalizers:
            finalizer.detach()

    # -- operators -----------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.bar is not None:
            self.bar.update()
            if self.bar.total is not None and self.bar.n >= self.bar.total:  # past the estimate
                self.bar.total = self.bar.n + 1
        self.flush_releases()
        arg_tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        arg_names = [self.name_of(t) for t in arg_tensors]
        written = _written_tensor_ids(func, args, kwargs)
        transient = self._emit_temporaries(func, args, kwargs, arg_tensors, arg_names)

        out, seconds = self._run(func, args, kwargs, written)
        results = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        new_results = [o for o in results if id(o) not in written]
        mutated = [i for i, t in enumerate(arg_tensors) if id(t) in written]

        if not new_results and not mutated:
            # Nothing the log can express (e.g. ``.item()``): no tensor produced or written.
            self.skipped_ops[func.overloadpacket.__name__] = self.skipped_ops.get(func.overloadpacket.__name__, 0) + 1
            return out

        cost = seconds if self.cost == "time" else self._model_cost(func, args, kwargs, out, new_results, arg_tensors,
                                                                    mutated)
        op_name = func.overloadpacket.__name__
        if new_results:
            self._emit_call(op_name, arg_tensors, arg_names, new_results, cost)
        if mutated:
            # An operator that both returns fresh tensors and writes its arguments
            # (batch norm) is charged once, on the CALL.
            self._emit(INSTRUCTION="MUTATE", NAME=op_name, ARGS=arg_names, MUTATE=mutated,
                       TIME=str(0 if new_results else cost))
        del transient  # freed once the call has returned: its RELEASE follows the call's lines
        self.flush_releases()
        return out

    def _emit_temporaries(self, func, args, kwargs, arg_tensors, arg_names) -> torch.Tensor | None:
        """The call's measured temporaries as allocations of the log (``<op>_held``, kept to the step's end;
        ``<op>_temporary``, returned, to be freed once the call has run), each a CALL on the call's arguments
        before the call itself: its outputs are allocated while they are live."""
        measured = self.temporaries(func, args, kwargs) if self.temporaries is not None else None
        if measured is None:
            return None
        made = {}
        for kind, size in zip(TEMPORARY_KINDS, (measured.held, measured.transient)):
            if size:
                made[kind] = torch.empty(size, dtype=torch.uint8, device="meta")
                self._emit_call(f"{func.overloadpacket.__name__}_{kind}", arg_tensors, arg_names, [made[kind]], 0)
        if "held" in made:
            self._held_temporaries.append(made["held"])
        return made.get("temporary")

    def _emit_call(self, op_name, arg_tensors, arg_names, results, cost) -> None:
        args = list(arg_names)
        arg_storages = [_storage_key(t) for t in arg_tensors]
        claimed: set[int] = set()  # storages allocated by this very call
        entries = []
        for o in results:
            storage = _storage_key(o)
            if storage in arg_storages:
                size, alias = 0, arg_storages.index(storage)
            elif storage in self._storage_names:
                # A view of a live storage that is not an argument: make that dependency explicit.
                args.append(next(iter(self._storage_names[storage])))
                arg_storages.append(storage)
                size, alias = 0, len(args) - 1
            elif storage in claimed:
                # Two results of one call on one new storage: charge the storage once.
                size, alias = 0, -1
            else:
                claimed.add(storage)
                size, alias = o.untyped_storage().nbytes(), -1
                self._track_storage(o)
            entries.append((o, self._fresh(), size, alias))
        self._emit(INSTRUCTION="CALL", NAME=op_name, ARGS=args, RESULT=[name for _, name, _, _ in entries],
                   TIME=str(cost))
        for o, name, size, alias in entries:
            self._emit(INSTRUCTION="MEMORY", NAME=name, MEMORY=str(size))
            self._emit(INSTRUCTION="ALIAS", NAME=name, ALIAS=str(alias))
            self._bind(o, name)

    def _run(self, func, args, kwargs, written: set[int]):
        """Run the operator; in time mode also time it, returning the median in ns."""
        start = time.perf_counter_ns()
        out = func(*args, **kwargs)
        samples = [time.perf_counter_ns() - start]
        if self.cost != "time" or torch.Tag.nondeterministic_seeded in func.tags:
            # Repeating a random operator would advance the generator the step uses.
            return out, samples[0]
        for _ in range(self.repeats - 1):
            # Repeats of an in-place operator write to clones so the step's values are unchanged.
            clones: dict[int, torch.Tensor] = {}

            def clone_written(a):
                if isinstance(a, torch.Tensor) and id(a) in written:
                    if id(a) not in clones:
                        clones[id(a)] = a.clone()
                    return clones[id(a)]
                return a

            rep_args, rep_kwargs = tree_map(clone_written, (args, kwargs))
            start = time.perf_counter_ns()
            func(*rep_args, **rep_kwargs)
            samples.append(time.perf_counter_ns() - start)
        return out, int(statistics.median(samples))

    def _model_cost(self, func, args, kwargs, out, new_results, arg_tensors, mutated) -> int:
        """FLOPs, or the roofline time in ns (shapes and dtypes only: works on the meta device)."""
        # What the operator writes: fresh results (views write nothing) and written arguments.
        arg_storages = {_storage_key(a) for a in arg_tensors}
        written = [o for o in new_results if _storage_key(o) not in arg_storages]
        written += [arg_tensors[i] for i in mutated]
        formula = flop_registry.get(func.overloadpacket) or _ATTENTION_FLOPS.get(func.overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
        else:
            flops = sum(o.numel() for o in written)  # one FLOP per element produced
        if self.gpu is None:
            return flops
        if not written:
            return 0  # a view: no data moves
        bytes_moved = sum(t.numel() * t.element_size() for t in arg_tensors + written)
        matmul_16bit = formula is not None and any(t.dtype in _HALF_DTYPES for t in arg_tensors)
        return roofline_ns(self.gpu, flops, bytes_moved, matmul_16bit)


def _written_tensor_ids(func, args, kwargs) -> set[int]:
    """ids of the tensors the operator writes to, per its schema."""
    schema = func._schema
    written_names = set(_UNDECLARED_WRITES.get(func, ()))
    if func in _UNDECLARED_WRITES and not _argument_value(schema, args, kwargs, "training"):
        written_names = set()
    ids = set()
    for argument in schema.arguments:
        if argument.name in written_names or (argument.alias_info is not None and argument.alias_info.is_write):
            value = _argument_value(schema, args, kwargs, argument.name)
            ids.update(id(t) for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))
    return ids


def _argument_value(schema, args, kwargs, name):
    for position, argument in enumerate(schema.arguments):
        if argument.name == name:
            if name in kwargs:
                return kwargs[name]
            if position < len(args) and not argument.kwarg_only:
                return args[position]
            return None
    raise KeyError(name)


def default_loss(output) -> torch.Tensor:
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    total = tensors[0].sum()
    for t in tensors[1:]:
        total = total + t.sum()
    return total


def record(module: torch.nn.Module, inputs, *, loss_fn: Callable | None = None,
           optimizer: torch.optim.Optimizer | None = None, cost: str = "time", repeats: int = 5,
           recorder_class: type[Recorder] | None = None, progress: bool = False) -> Recording:
    """Record one training step of ``module`` on ``inputs``.

    ``inputs`` is a tensor or a tuple of positional arguments.  The step is
    ``loss_fn(module(*inputs)).backward()`` (the default loss sums every output
    that requires grad), then ``optimizer.step()`` if an optimizer is given.
    Gradients are set to None first so that the step starts from a clean state.
    ``recorder_class`` (a subclass of the recorder, built with ``(cost, repeats)``) lets
    dtrlab.execute run the same step through the same recorder while it executes it.
    ``progress`` shows a bar of the operators recorded; the backward pass is estimated at
    :data:`BACKWARD_ESTIMATE` times the forward's operators.
    """
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    loss_fn = loss_fn or default_loss
    devices = sorted({t.device.type for t in _leaf_tensors(module, inputs)})
    if cost == "time" and "meta" in devices:
        raise ValueError("cost 'time' measures real operators: the model is on the meta device (capture with "
                         "--real, or choose --cost flops or roofline:GPU)")
    module.zero_grad(set_to_none=True)
    recorder = (recorder_class or Recorder)(cost, repeats)
    bar = progress_bar(desc="capture forward", unit="op", disable=not progress)
    recorder.bar = bar
    gc_was_enabled = gc.isenabled()
    gc.disable()  # collection of cycles at random points would make the log nondeterministic
    try:
        recorder._emit(INSTRUCTION="ANNOTATE", ANNOTATION="START")
        for t in _leaf_tensors(module, inputs):
            recorder.name_of(t)
        with recorder:
            loss = loss_fn(module(*inputs))
            recorder.flush_releases()
            recorder._emit(INSTRUCTION="ANNOTATE", ANNOTATION="BACKWARD")
            bar.set_description("capture backward (total estimated)")
            bar.total = round(bar.n * (1 + BACKWARD_ESTIMATE))
            bar.refresh()
            loss.backward()
            del loss  # like the model's activations, the loss does not outlive the step
            if optimizer is not None:
                optimizer.step()
        recorder.close()
    finally:
        bar.total = bar.n  # the estimate gives way to the count
        bar.close()
        if gc_was_enabled:
            gc.enable()
    meta = {
        "torch_version": torch.__version__,
        "device": ",".join(devices),
        "cost_model": cost,
        "cost_unit": "flop" if cost == "flops" else "ns",
        "repeats": recorder.repeats if cost == "time" else 1,
        "ops": sum(1 for line in recorder.lines if line["INSTRUCTION"] in ("CALL", "MUTATE")),
        "skipped_ops": recorder.skipped_ops,
    }
    return Recording(recorder.lines, recorder.peak_live_bytes, meta, pinned_bytes=recorder.pinned_bytes)


def _leaf_tensors(module: torch.nn.Module, inputs: Sequence) -> Iterable[torch.Tensor]:
    """Parameters, buffers and input tensors: the step's constants."""
    yield from module.parameters()
    yield from module.buffers()
    yield from (t for t in tree_flatten(list(inputs))[0] if isinstance(t, torch.Tensor))


#: Numeric options of :func:`capture` that count something (so must be >= 1).
_COUNTS = ("repeats", "batch", "seq", "image", "layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")


def capture(source: str, *, real: bool = False, cost: str = "flops", repeats: int = 5, progress: bool = False,
            **build_options) -> Recording:
    """Build model ``source`` (see :mod:`dtrlab.trace.models`) and record its training step.

    On the meta device unless ``real`` (CPU tensors, needed for ``cost="time"``); ``progress``
    shows a bar of the operators recorded.
    Errors name the model and the cause.
    """
    from .models import build, fake_workload, meta_patches

    check_cost_model(cost)
    for key, value in {"repeats": repeats, **build_options}.items():
        if key in _COUNTS and value is not None and not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{key} must be a whole number >= 1, got {value!r}")
    if cost == "time" and not real:
        raise ValueError("cost 'time' times real operators: add --real (or choose flops or roofline:GPU)")
    # Autocast has no meta device (torch._C._is_autocast_available("meta") is False): without
    # --real, a step under autocast runs on fake CPU tensors (no data either).
    fake = build_options.get("autocast") is not None and not real
    device = "cpu" if real or fake else "meta"
    with fake_workload(source, **build_options) if fake else contextlib.nullcontext() as workload:
        workload = workload or build(source, device=device, **build_options)
        try:
            # The step runs on the same default device: tensors the model makes itself land there too.
            with torch.device(device), meta_patches():
                recording = record(workload.module, workload.inputs, loss_fn=workload.loss_fn, cost=cost,
                                   repeats=repeats, progress=progress)
        except Exception as exc:
            raise _step_error(source, real, fake, exc) from exc
    recording.meta.update(source=source, batch=workload.batch, input_shape=workload.input_shape, desc=workload.desc)
    if fake:
        recording.meta.update(device="cpu (fake tensors)")
    return recording


def _step_error(source: str, real: bool, fake: bool, exc: Exception) -> ValueError:
    from .models import ModelSourceError

    where = ("real tensors" if real else "fake CPU tensors (no data; try --real to compare)" if fake
             else "meta tensors (no data; try --real to compare)")
    return ModelSourceError(f"{source}: the training step raised on {where}: {type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")


def package_versions() -> dict:
    """Versions of the packages a trace depends on (those installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("dtrlab", "torch", "torchvision", "transformers", "diffusers"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found
