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
"""

from __future__ import annotations

from ..trace.partition import partitioner_config
from .fit_knob import KnobFit, fit_knob


class KnobBackend:
    """A torch.compile backend: ``inner`` run with ``activation_memory_budget = knob`` (and ``solver``)."""

    def __init__(self, inner, knob: float, solver: str | None = None):
        self.inner, self.knob, self.solver = inner, knob, solver
        self.compiler_name = f"{getattr(inner, 'compiler_name', 'backend')}+activation_memory_budget={knob:g}"

    def __call__(self, graph_module, example_inputs, **kwargs):
        # mode and options were given to ``inner`` when it was built; torch.compile hands them again
        # to a callable backend only when the caller passed them, and they are the same.
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
    chosen before the first call). ``backend``: torch.compile's (a name or a callable; the pick uses the
    Inductor accounting for ``"inductor"``, the aot_eager one for any other),
    ``solver``: ``activation_memory_budget_solver`` for the pick and the compile; the rest goes
    to torch.compile. The choice record is the result's ``knob_fit``. When no knob value fits,
    ValueError (one line, with what would fit instead)."""
    import torch

    if example_inputs == () or example_inputs is None:
        raise ValueError("dtrlab.compile needs example_inputs: the knob is chosen before the first call")
    # The pick under the accounting of the backend that compiles (a backend dtrlab does not model: aot_eager's).
    fit = fit_knob(model, example_inputs, loss_fn, budget=budget, device=device, accounting=accounting,
                   solver=solver, cache=cache, backend="inductor" if backend == "inductor" else "aot_eager")
    if fit.knob is None:
        raise ValueError(f"budget: {fit.warnings()[0]}")
    compiled = torch.compile(model, backend=KnobBackend(_inner_backend(backend, torch_compile_kwargs), fit.knob,
                                                        solver), **torch_compile_kwargs)
    compiled.knob_fit = fit
    return compiled


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


__all__ = ["KnobBackend", "KnobFit", "compile"]
