"""Run many simulations of one trace, in this process, in local processes or on Dask.

:func:`run_many` is the shared parallel-run interface: give it a trace and a list of
:class:`RunSpec` and it returns one :class:`~dtrlab.runtime.RunResult` per spec, in
spec order. Every worker receives the trace once (loky: as the worker initializer's
argument; Dask: scattered to all workers once), never once per budget; a spec carries
only its budget, policy instance and options.
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
from ..trace.model import Trace
from .execution import SERIAL, Execution

BACKENDS = ("sequential", "loky", "dask")
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


# The trace of this loky worker process, installed once by the executor's initializer.
_worker_trace: Trace | None = None


def _install_worker_trace(trace: Trace) -> None:
    global _worker_trace
    _worker_trace = trace


def _run_in_worker(spec: RunSpec) -> tuple[RunResult, float]:
    return run_spec(_worker_trace, spec)


def _run_on_dask(spec: RunSpec, trace: Trace) -> tuple[RunResult, float]:
    return run_spec(trace, spec)


def _jobs(jobs: int) -> int:
    if jobs == -1:
        return os.cpu_count() or 1
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive number of processes (or -1 for all {os.cpu_count()} cores), "
                         f"got {jobs!r}")
    return jobs


def iter_runs(trace: Trace, specs: list[RunSpec], *, execution: Execution = SERIAL,
              desc: str | None = None) -> Iterator[tuple[int, RunResult, float]]:
    """Yield ``(spec index, result, wall seconds)`` as runs finish (any order), where ``execution``
    says (its ``cache`` is not used here).

    The sweep cache consumes this to store each result as soon as it exists.
    """
    backend, client = execution.backend, execution.client
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)} "
                         "(dask needs Execution(client=) a distributed.Client or a scheduler address)")
    if client is not None and backend != "dask":
        backend = "dask"
    for spec in specs:
        if not isinstance(spec, RunSpec):
            raise TypeError(f"run_many takes a list of RunSpec, got {type(spec).__name__}")
    jobs = _jobs(execution.jobs)
    bar = progress_bar(total=len(specs), desc=desc or trace.name, unit="run", disable=not execution.progress or not specs)
    try:
        if backend == "dask":
            runs = _iter_dask(trace, specs, client)
        elif backend == "sequential" or jobs == 1 or len(specs) <= 1:
            runs = ((i, *run_spec(trace, spec)) for i, spec in enumerate(specs))
        else:
            runs = _iter_loky(trace, specs, jobs)
        for run in runs:
            bar.update()
            yield run
    finally:
        bar.close()


def _iter_loky(trace: Trace, specs: list[RunSpec], jobs: int) -> Iterator[tuple[int, RunResult, float]]:
    from concurrent.futures import as_completed

    from joblib.executor import get_memmapping_executor

    # joblib's reusable loky executor (the one joblib.Parallel shares; loky's own would leave it
    # unusable for a later Parallel call), kept while the trace is the same object, so refinement
    # rounds do not respawn workers.
    executor = get_memmapping_executor(jobs, initializer=_install_worker_trace, initargs=(trace,))
    futures = {executor.submit(_run_in_worker, spec): i for i, spec in enumerate(specs)}
    try:
        for future in as_completed(futures):
            yield (futures[future], *future.result())
    finally:
        for future in futures:
            future.cancel()


def _iter_dask(trace: Trace, specs: list[RunSpec], client) -> Iterator[tuple[int, RunResult, float]]:
    from distributed import Client, as_completed

    if client is None:
        raise ValueError("backend='dask' needs Execution(client=) a distributed.Client or a scheduler address "
                         "such as 'tcp://127.0.0.1:8786'")
    own_client = isinstance(client, str)
    if own_client:
        try:
            client = Client(client, timeout=SCHEDULER_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise ValueError(f"no Dask scheduler answers at {client} within {SCHEDULER_TIMEOUT_S} s ({exc}); start "
                             "one with `dask scheduler`, or run locally (Execution(jobs=N))") from None
    try:
        remote_trace = client.scatter(trace, broadcast=True, hash=False)
        futures = client.map(_run_on_dask, specs, trace=remote_trace, pure=False)
        index = {future.key: i for i, future in enumerate(futures)}
        try:
            for future in as_completed(futures):
                yield (index[future.key], *future.result())
        finally:
            client.cancel(futures)
            client.cancel(remote_trace)
    finally:
        if own_client:
            client.close()


def run_many(trace: Trace, specs: list[RunSpec], *, execution: Execution = SERIAL,
             desc: str | None = None) -> list[RunResult]:
    """Run every spec on ``trace``; results come back in spec order.

    ``execution.backend``: ``"sequential"`` (this process), ``"loky"`` (``jobs`` local
    processes through joblib's loky executor; ``jobs=1`` runs in this process) or
    ``"dask"`` (``client`` is a ``distributed.Client`` or a scheduler address, which must
    answer within :data:`SCHEDULER_TIMEOUT_S`; giving a client selects Dask). A progress bar (one line per stage off a
    terminal, :mod:`dtrlab.progress`) shows progress unless ``execution.progress`` is False; ``execution.cache`` is not used.
    """
    results: list[RunResult | None] = [None] * len(specs)
    for i, result, _ in iter_runs(trace, specs, execution=execution, desc=desc):
        results[i] = result
    return results
