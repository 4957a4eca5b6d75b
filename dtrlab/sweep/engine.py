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

from tqdm.auto import tqdm

from ..policies import Policy
from ..runtime import DEFAULT_OVERHEAD_LIMIT, FLAT, RESERVED, Intervention, RunResult, simulate
from ..trace.model import Trace

BACKENDS = ("sequential", "loky", "dask")


@dataclass(frozen=True)
class RunSpec:
    """One simulation to run: a budget and a policy instance (pickled by value).

    ``memory`` names the memory model; ``memory_options`` are its options as sorted
    ``(key, value)`` pairs (every run builds its own model from them). ``enforce`` and
    ``device_capacity`` are the runtime semantics, as in :func:`~dtrlab.simulate`.
    """

    budget_bytes: int
    policy: Policy
    overhead_limit: float = DEFAULT_OVERHEAD_LIMIT
    intervention: Intervention | None = None
    ratio: float | None = None
    memory: str = FLAT
    memory_options: tuple[tuple[str, object], ...] = ()
    enforce: str = RESERVED
    device_capacity: str | None = None


def run_spec(trace: Trace, spec: RunSpec) -> tuple[RunResult, float]:
    """Simulate one spec; returns the result and its wall seconds."""
    started = time.perf_counter()
    result = simulate(trace, spec.policy, budget_bytes=spec.budget_bytes, overhead_limit=spec.overhead_limit,
                      intervention=spec.intervention, memory=spec.memory, memory_options=dict(spec.memory_options),
                      enforce=spec.enforce, device_capacity=spec.device_capacity)
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


def iter_runs(trace: Trace, specs: list[RunSpec], *, jobs: int = 1, backend: str = "loky", client=None,
              progress: bool = True, desc: str | None = None) -> Iterator[tuple[int, RunResult, float]]:
    """Yield ``(spec index, result, wall seconds)`` as runs finish (any order).

    The sweep cache consumes this to store each result as soon as it exists.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)} "
                         "(dask needs client= a distributed.Client or a scheduler address)")
    if client is not None and backend != "dask":
        backend = "dask"
    for spec in specs:
        if not isinstance(spec, RunSpec):
            raise TypeError(f"run_many takes a list of RunSpec, got {type(spec).__name__}")
    jobs = _jobs(jobs)
    bar = tqdm(total=len(specs), desc=desc or trace.name, unit="run", disable=not progress or not specs)
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
        raise ValueError("backend='dask' needs client= a distributed.Client or a scheduler address "
                         "such as 'tcp://127.0.0.1:8786'")
    own_client = isinstance(client, str)
    if own_client:
        client = Client(client)
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


def run_many(trace: Trace, specs: list[RunSpec], *, jobs: int = 1, backend: str = "loky", client=None,
             progress: bool = True, desc: str | None = None) -> list[RunResult]:
    """Run every spec on ``trace``; results come back in spec order.

    ``backend``: ``"sequential"`` (this process), ``"loky"`` (``jobs`` local
    processes through joblib's loky executor; ``jobs=1`` runs in this process) or
    ``"dask"`` (``client`` is a ``distributed.Client`` or a scheduler address; giving
    a client selects Dask). A tqdm bar shows progress unless ``progress=False``.
    """
    results: list[RunResult | None] = [None] * len(specs)
    for i, result, _ in iter_runs(trace, specs, jobs=jobs, backend=backend, client=client, progress=progress,
                                  desc=desc):
        results[i] = result
    return results
