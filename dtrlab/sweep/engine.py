"""Run many simulations of one trace, in this process, in local processes or on Dask.

:func:`run_many` is the shared parallel-run interface: give it a trace and a list of
:class:`RunSpec` and it returns one :class:`~dtrlab.runtime.RunResult` per spec, in
spec order. Every worker receives the trace once (fork: inherited; loky: as the worker
initializer's argument; Dask: scattered to all workers once), never once per budget; a
spec carries only its budget, policy instance and options. :class:`Workers` is that
dispatch for any function of (shared value, item): the knob census
(:func:`dtrlab.analysis.knob_census.census_knob`) ships a model source's spec through it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..policies import Policy
from ..progress import progress_bar
from ..runtime import REFERENCE, Intervention, RunResult, Semantics, simulate
from ..suggest import did_you_mean
from ..trace.model import Trace
from .execution import SERIAL, Execution

BACKENDS = ("sequential", "fork", "loky", "dask")
#: Seconds to wait for a Dask scheduler given by address (Dask itself waits 30 s): a dead one fails fast.
SCHEDULER_TIMEOUT_S = 5


@dataclass(frozen=True)
class RunSpec:
    """One simulation to run: a budget and a policy instance (pickled by value), under ``semantics``
    (every run builds its own memory model from it), as in :func:`~dtrlab.simulate`.
    """

    budget_bytes: int
    policy: Policy
    semantics: Semantics = REFERENCE
    intervention: Intervention | None = None
    ratio: float | None = None


def run_spec(trace: Trace, spec: RunSpec) -> tuple[RunResult, float]:
    """Simulate one spec; returns the result and its wall seconds."""
    started = time.perf_counter()
    result = simulate(trace, spec.policy, budget_bytes=spec.budget_bytes, semantics=spec.semantics,
                      intervention=spec.intervention)
    seconds = time.perf_counter() - started
    return dataclasses.replace(result, ratio=spec.ratio), seconds


def _jobs(jobs: int) -> int:
    if jobs == -1:
        return os.cpu_count() or 1
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive number of processes (or -1 for all {os.cpu_count()} cores), "
                         f"got {jobs!r}")
    return jobs


def placement(execution: Execution) -> str:
    """Where ``execution``'s calls run: ``"sequential"`` (this process: that backend, or ``jobs == 1``),
    ``"fork"``, ``"loky"`` or ``"dask"`` (a ``client`` selects Dask). An unknown backend is a ValueError."""
    backend = execution.backend
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}{did_you_mean(str(backend), BACKENDS)}; use one of "
                         f"{', '.join(BACKENDS)} (dask needs Execution(client=) a distributed.Client or a scheduler "
                         "address)")
    if execution.client is not None or backend == "dask":
        return "dask"
    return "sequential" if backend == "sequential" or _jobs(execution.jobs) == 1 else backend


class Workers:
    """``function(shared, item)`` called for many items where an :class:`Execution` says, ``shared`` given
    to each worker once: inherited by processes forked from this one (``fork``, POSIX only), the
    initializer's argument of joblib's reusable loky executor (``loky``; kept while ``function`` and
    ``shared`` compare equal, so successive :meth:`imap` rounds and later uses reuse the workers), or
    scattered to every Dask worker (``dask``). Use as a context manager; :meth:`imap` may be called
    many times inside it (a census's rounds) and yields ``(item index, result)`` as calls finish."""

    def __init__(self, function, shared, execution: Execution = SERIAL):
        self.function, self.shared, self.execution = function, shared, execution
        self.where, self.jobs = placement(execution), _jobs(execution.jobs)
        self._pool = self._client = self._remote = None
        self._own_client = False

    def __enter__(self) -> "Workers":
        global _forked
        if self.where == "fork":
            import multiprocessing

            _forked = (self.function, self.shared)
            try:
                self._pool = multiprocessing.get_context("fork").Pool(self.jobs)
            finally:
                _forked = None  # the workers hold it from here
        elif self.where == "loky":
            from joblib.executor import get_memmapping_executor

            # joblib's reusable loky executor (the one joblib.Parallel shares; loky's own would leave it
            # unusable for a later Parallel call)
            self._pool = get_memmapping_executor(self.jobs, initializer=_install_shared,
                                                 initargs=(self.function, self.shared))
        elif self.where == "dask":
            self._client, self._own_client = _dask_client(self.execution.client)
            self._remote = self._client.scatter(self.shared, broadcast=True, hash=False)
        return self

    def imap(self, items: list) -> Iterator[tuple[int, object]]:
        if self.where == "sequential":
            return ((i, self.function(self.shared, item)) for i, item in enumerate(items))
        if self.where == "fork":
            return self._pool.imap_unordered(_call_forked, list(enumerate(items)))
        if self.where == "loky":
            return _as_completed_loky(self._pool, items)
        return _as_completed_dask(self._client, self.function, self._remote, items)

    def __exit__(self, *exc) -> None:
        if self.where == "fork":
            self._pool.terminate()
            self._pool.join()
        elif self.where == "dask":
            self._client.cancel(self._remote)
            if self._own_client:
                self._client.close()


#: (function, shared) of a forked worker process (set in the parent only while its pool forks).
_forked: tuple | None = None
#: (function, shared) of this loky worker process, installed once by the executor's initializer.
_installed: tuple | None = None


def _call_forked(indexed: tuple[int, object]) -> tuple[int, object]:
    index, item = indexed
    function, shared = _forked
    return index, function(shared, item)


def _install_shared(function, shared) -> None:
    global _installed
    _installed = (function, shared)


def _call_installed(item):
    function, shared = _installed
    return function(shared, item)


def _call_on_dask(item, function, shared):
    return function(shared, item)


def _as_completed_loky(executor, items: list) -> Iterator[tuple[int, object]]:
    from concurrent.futures import as_completed

    futures = {executor.submit(_call_installed, item): i for i, item in enumerate(items)}
    try:
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:
        for future in futures:
            future.cancel()


def _dask_client(client) -> tuple[object, bool]:
    """(a distributed.Client, whether it is ours to close) for ``Execution.client``."""
    from distributed import Client

    if client is None:
        raise ValueError("backend='dask' needs Execution(client=) a distributed.Client or a scheduler address "
                         "such as 'tcp://127.0.0.1:8786'")
    if not isinstance(client, str):
        return client, False
    try:
        return Client(client, timeout=SCHEDULER_TIMEOUT_S), True
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"no Dask scheduler answers at {client} within {SCHEDULER_TIMEOUT_S} s ({exc}); start "
                         "one with `dask scheduler`, or run locally (Execution(jobs=N))") from None


def _as_completed_dask(client, function, remote, items: list) -> Iterator[tuple[int, object]]:
    from distributed import as_completed

    futures = client.map(_call_on_dask, items, function=function, shared=remote, pure=False)
    index = {future.key: i for i, future in enumerate(futures)}
    try:
        for future in as_completed(futures):
            yield index[future.key], future.result()
    finally:
        client.cancel(futures)


def iter_runs(trace: Trace, specs: list[RunSpec], *, execution: Execution = SERIAL,
              desc: str | None = None) -> Iterator[tuple[int, RunResult, float]]:
    """Yield ``(spec index, result, wall seconds)`` as runs finish (any order), where ``execution``
    says (:class:`Workers`: each worker receives the trace once; its ``cache`` is not used here).

    The sweep cache consumes this to store each result as soon as it exists.
    """
    for spec in specs:
        if not isinstance(spec, RunSpec):
            raise TypeError(f"run_many takes a list of RunSpec, got {type(spec).__name__}")
    if len(specs) <= 1 and placement(execution) != "dask":
        execution = execution.with_(backend="sequential")
    bar = progress_bar(total=len(specs), desc=desc or trace.name, unit="run", disable=not execution.progress or not specs)
    try:
        with Workers(run_spec, trace, execution) as workers:
            for i, (result, seconds) in workers.imap(specs):
                bar.update()
                yield i, result, seconds
    finally:
        bar.close()


def run_many(trace: Trace, specs: list[RunSpec], *, execution: Execution = SERIAL,
             desc: str | None = None) -> list[RunResult]:
    """Run every spec on ``trace``; results come back in spec order.

    ``execution.backend``: ``"sequential"`` (this process), ``"fork"`` (``jobs`` processes forked
    from this one; POSIX only), ``"loky"`` (``jobs`` local processes through joblib's loky executor;
    ``jobs=1`` runs in this process for both) or
    ``"dask"`` (``client`` is a ``distributed.Client`` or a scheduler address, which must
    answer within :data:`SCHEDULER_TIMEOUT_S`; giving a client selects Dask). A progress bar (one line per stage off a
    terminal, :mod:`dtrlab.progress`) shows progress unless ``execution.progress`` is False; ``execution.cache`` is not used.
    """
    results: list[RunResult | None] = [None] * len(specs)
    for i, result, _ in iter_runs(trace, specs, execution=execution, desc=desc):
        results[i] = result
    return results
