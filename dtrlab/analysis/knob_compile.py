"""``dtrlab.compile``: torch.compile with the ``activation_memory_budget`` that fits a byte budget, for one model.

::

    model = dtrlab.compile(model, budget="40GiB", example_inputs=(tokens,), loss_fn=loss)
    for tokens in loader:                    # a drop-in for torch.compile(model)
        loss(model(tokens)).backward(); optimizer.step(); optimizer.zero_grad()
    print(model.knob_fit.describe())         # the choice, its margin, cost and warnings

:func:`compile` picks the knob with :func:`dtrlab.analysis.fit_knob.fit_knob` and returns
``torch.compile(model, backend=KnobBackend(...))``: a wrapper of the requested backend
(``"inductor"`` by default, built with the given ``mode`` and ``options`` as torch.compile
builds it, torch/__init__.py:3273-3278) that patches ``torch._functorch.config`` (the knob,
and the solver if given) only while the wrapped backend runs. torch compiles lazily (at the
first call, at every recompile) and the partitioner runs inside the backend call (AOT autograd
partitions the joint graph while the backend compiles the forward), so the knob holds whenever
torch partitions for this model, no global configuration is left changed, and two models
compiled with different budgets in one process each keep their own (tests/test_fit_knob.py
reads the knob torch's partitioner sees). The patch is also in force when AOT autograd's cache
keys the compile on the functorch configuration.

**A second run starts in seconds.** With a cache, the pick for a live model compiled by Inductor or
aot_eager is also kept under the model's fingerprint (:func:`dtrlab.trace.torch_compile.fingerprint.step_fingerprint`:
the model's classes, their source files, parameters, attributes, the inputs, the loss function's code, torch's
version and configuration, hashed without tracing), together with the hash of every graph dynamo handed the
backend when that run compiled (:func:`dtrlab.trace.torch_compile.fingerprint.dynamo_graph_hash`). A later run with the
same fingerprint reads the pick without tracing, and when torch compiles, each graph must be one of those: a graph that
is not (the model's code changed where the fingerprint does not look, say a helper in another file) gets a warning
and the entry is dropped, so the next run picks afresh. A pick whose run never compiled is not read by
fingerprint. The graph torch compiles is the model's alone when ``loss_fn`` is given (the loss runs eager): the
loss is checked by its code in the fingerprint only.
"""

from __future__ import annotations

import dataclasses
import time
import warnings

from ..trace.torch_compile.fingerprint import dynamo_graph_hash, step_fingerprint
from ..trace.torch_compile.joint import BACKENDS
from ..trace.torch_compile.partition import partitioner_config
from .fit_knob import (KnobFit, accounting_column, budget_bytes, cache_path, fit_knob, from_dict, lowering_for,
                       read_entry, search_settings, write_entry)

#: What a fingerprint entry's checksum covers: the pick, and the graphs its run compiled.
ENTRY_FIELDS = ("record", "compiled")


class KnobBackend:
    """A torch.compile backend: ``inner`` run with ``activation_memory_budget = knob`` (and ``solver``)."""

    def __init__(self, inner, knob: float, solver: str | None = None, graphs: CompiledGraphs | None = None):
        self.inner, self.knob, self.solver, self.graphs = inner, knob, solver, graphs
        # torch.compile's wrapper names a callable backend by its __name__ (torch/__init__.py:2980), the name
        # dynamo's logs and recompile reasons print.
        self.compiler_name = self.__name__ = \
            f"{getattr(inner, 'compiler_name', 'backend')}+activation_memory_budget={knob:g}"

    def __call__(self, graph_module, example_inputs, **kwargs):
        # mode and options were given to ``inner`` when it was built; torch.compile hands them again
        # to a callable backend only when the caller passed them, and they are the same.
        if self.graphs is not None:
            self.graphs.note(dynamo_graph_hash(graph_module, example_inputs))
        with partitioner_config(self.knob, self.solver):
            return self.inner(graph_module, example_inputs)

    def reset(self) -> None:
        if hasattr(self.inner, "reset"):
            self.inner.reset()


def compile(model, *, budget, example_inputs=(), loss_fn=None, device: str | None = None,
            accounting: str | None = None, solver: str | None = None, backend="inductor", cache=True,
            **torch_compile_kwargs):
    """``torch.compile(model, ...)`` with the largest knob that fits ``budget`` applied to this compile alone.

    ``budget``, ``example_inputs``, ``loss_fn``, ``device``, ``accounting`` and ``cache`` are
    :func:`~dtrlab.analysis.fit_knob.fit_knob`'s (``example_inputs`` are needed: the knob is
    chosen before the first call; a GPU preset as ``device``, ``"H100-80GB"``, picks under CUDA Inductor's
    lowering for it, ``"cuda"`` or a model on CUDA under this machine's GPU's, the CPU under the CPU's, and
    ``knob_fit`` says which). ``backend``: torch.compile's (a name or a callable; the pick uses the
    Inductor accounting for ``"inductor"``, the aot_eager one for any other),
    ``solver``: ``activation_memory_budget_solver`` for the pick and the compile; the rest goes
    to torch.compile. The choice record is the result's ``knob_fit``. When no knob value fits,
    ValueError (one line, with what would fit instead)."""
    import torch

    if example_inputs == () or example_inputs is None:
        raise ValueError("dtrlab.compile needs example_inputs: the knob is chosen before the first call")
    pick = dict(budget=budget, device=device, accounting=accounting, solver=solver, cache=cache,
                # the pick under the accounting of the backend that compiles (one dtrlab does not model: aot_eager's)
                backend="inductor" if backend == "inductor" else "aot_eager")
    if cache and backend in BACKENDS and isinstance(model, torch.nn.Module):
        fit, graphs = _fit_by_fingerprint(model, example_inputs, loss_fn, pick)
    else:
        fit, graphs = fit_knob(model, example_inputs, loss_fn, **pick), None
    if fit.knob is None:
        raise ValueError(f"budget: {fit.warnings()[0]}")
    compiled = torch.compile(model, backend=KnobBackend(_inner_backend(backend, torch_compile_kwargs), fit.knob,
                                                        solver, graphs), **torch_compile_kwargs)
    compiled.knob_fit, compiled.knob_graphs = fit, graphs
    return compiled


class CompiledGraphs:
    """The graphs dynamo hands the backend of one ``dtrlab.compile``, against its fingerprint entry: recorded
    into it when the pick was searched in this run (``expected`` None), checked against it when the pick was read
    by fingerprint (a graph not in ``expected`` warns and drops the entry)."""

    def __init__(self, path, document: dict, expected: frozenset | None):
        self.path, self.document, self.expected = path, document, expected
        self.checked: list[str] = []
        self.unexpected: list[str] = []

    def note(self, graph: str) -> None:
        if self.expected is None:
            if graph not in self.document["compiled"]:
                self.document["compiled"].append(graph)
                write_entry(self.path, self.document, ENTRY_FIELDS)
        elif graph in self.expected:
            self.checked.append(graph)
        else:
            self.unexpected.append(graph)
            if len(self.unexpected) == 1:
                knob = self.document["record"]["knob"]
                warnings.warn(f"dtrlab.compile: torch compiles a graph this model did not have when its pick (knob "
                              f"{knob:g}) was cached ({self.path}): the model or its inputs changed since; this "
                              f"compile keeps knob {knob:g} unchecked, and the entry is dropped so that the next run "
                              "picks afresh")
                self.path.unlink(missing_ok=True)


def _fit_by_fingerprint(model, example_inputs, loss_fn, pick: dict) -> tuple[KnobFit, CompiledGraphs]:
    """The pick read by the model's fingerprint when a run that compiled it left one, else searched (its entry
    written when torch compiles, with the graphs: an entry without them is never read)."""
    started = time.perf_counter()
    budget, preset = budget_bytes(pick["budget"])
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    key = {"fingerprint": step_fingerprint(model, inputs, loss_fn), "device": pick["device"],
           **search_settings(budget=budget, column=accounting_column(pick["accounting"], preset),
                             backend=pick["backend"], solver=pick["solver"], runtime_estimator=None,
                             lowering=lowering_for(model, pick["device"]))}
    path = cache_path(pick["cache"], key, "by-fingerprint")
    document = read_entry(path, key, ENTRY_FIELDS)
    if document is not None and document["compiled"]:
        fit = dataclasses.replace(from_dict(document["record"]), seconds=time.perf_counter() - started,
                                  from_cache="fingerprint")
        return fit, CompiledGraphs(path, document, frozenset(document["compiled"]))
    fit = fit_knob(model, example_inputs, loss_fn, **pick)
    return fit, CompiledGraphs(path, {"key": key, "record": fit.to_dict(), "compiled": []}, None)


def _inner_backend(backend, kwargs: dict):
    """The backend torch.compile would build from ``backend``, ``mode``, ``options`` and ``dynamic``
    (torch/__init__.py:3273-3278: its inductor wrapper, or its wrapper of a named or callable backend)."""
    import torch

    mode, options, dynamic = kwargs.get("mode"), kwargs.get("options"), kwargs.get("dynamic")
    options = {k: v for k, v in (options or {}).items() if k not in ("guard_filter_fn", "use_aoti")} or None
    if backend == "inductor":
        return torch._TorchCompileInductorWrapper(mode, options, dynamic)
    try:
        return torch._TorchCompileWrapper(backend, mode, options, dynamic)
    except Exception as exc:  # torch's lookup of an unknown backend name
        raise ValueError(f"backend {backend!r}: {str(exc).strip().splitlines()[0]}") from None


__all__ = ["CompiledGraphs", "KnobBackend", "KnobFit", "compile"]
