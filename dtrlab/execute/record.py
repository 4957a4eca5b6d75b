"""Real runs as data: an :class:`ExecuteResult` without its tensors, as JSON, shipped and verified.

A record holds what notebook 11 shows of a real step: the simulator's ``RunResult`` (every
field), the device, the step's wall time, each real recomputation (operator, name, cost, wall
ns), the memory timeline, the CUDA allocator's peaks, the loss's value and the machine that
measured it. No tensors: :func:`from_record` gives an ``ExecuteResult`` with no loss,
gradients or parameters.

A record is stored under the sha256 of its **key**: everything that determines the run
(the step's model source, build options, cost model, device, optimizer and captured trace's
content hash; budget, policy, memory model and options, runtime semantics, overhead limit;
torch's, dtrlab's and the simulator's versions). :func:`run_or_load` uses a record of the
shipped bundle (``results/shipped/execute/``) only when its key is the one asked for and
the file matches the bundle's ``MANIFEST.json``; otherwise (one-line warning) it executes the
step for real. Wall times in a shipped record were measured on the machine that made it
(``made_on``), not this one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import time
import warnings
from pathlib import Path

import torch

from ..integrity import IntegrityError, atomic_write_json, read_json, verify_in_manifest
from ..policies import get_policy
from ..runtime import REFERENCE, SIMULATOR_VERSION, Failure, RunResult, Semantics
from ..version import __version__
from .runtime import Recomputation
from .step import CapturedStep, ExecuteResult, run_step

RECORD_FORMAT = "dtrlab-execute-record-1"
#: The bundle's subdirectory of real-run records (``results/shipped/execute/``).
SHIPPED_SUBDIR = "execute"


def record_key(step: CapturedStep, budget_bytes: int, *, policy="dtr", semantics: Semantics = REFERENCE) -> dict:
    """Everything that determines ``run_step(step, budget_bytes=..., policy=, semantics=)``'s record, normalized."""
    policy = get_policy(policy)
    semantics = semantics.normalized(policy)
    key = {"source": step.source, "build_options": step.build_options, "cost": step.cost, "device": step.device,
            "optimizer": step.optimizer, "trace_hash": step.trace.content_hash, "budget_bytes": int(budget_bytes),
            "policy": policy.label, "memory": semantics.memory, "memory_options": semantics.options,
            "enforce": semantics.enforce, "device_capacity": semantics.device_capacity,
            "overhead_limit": semantics.overhead_limit,
            "torch": torch.__version__, "dtrlab": __version__, "simulator_version": SIMULATOR_VERSION}
    return json.loads(json.dumps(key))  # as a stored record reads it back (tuples become lists)


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def record_path(directory: str | os.PathLike, key: dict) -> Path:
    """``directory/<source>-<first 16 hex digits of the key's sha256>.json``."""
    source = re.sub(r"[^A-Za-z0-9_.-]+", "_", key["source"])
    return Path(directory) / f"{source}-{key_digest(key)[:16]}.json"


def to_record(result: ExecuteResult, key: dict) -> dict:
    """The JSON-ready record of ``result`` (no tensors) under ``key``."""
    run = {f.name: getattr(result.run, f.name) for f in dataclasses.fields(RunResult)}
    run.update(evicted_storages=list(result.run.evicted_storages),
               memory_options=[list(pair) for pair in result.run.memory_options],
               failure=None if result.run.failure is None else dataclasses.asdict(result.run.failure))
    return {
        "format": RECORD_FORMAT, "key": key, "run": run, "device": result.device,
        "wall_seconds": result.wall_seconds, "loss": None if result.loss is None else float(result.loss),
        "recomputations": {f.name: [getattr(r, f.name) for r in result.recomputations]
                           for f in dataclasses.fields(Recomputation)},
        "memory_timeline": {"accounted": [a for a, _ in result.memory_timeline],
                            "resident": [r for _, r in result.memory_timeline]},
        "allocator": result.allocator,
        "made_on": {"machine": platform.machine(), "processor": platform.processor() or None,
                    "system": platform.system(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "date": time.strftime("%Y-%m-%d", time.gmtime())},
    }


def from_record(record: dict) -> ExecuteResult:
    """The :class:`ExecuteResult` of a record (no loss tensor, gradients or parameters)."""
    run = dict(record["run"])
    run.update(evicted_storages=tuple(run["evicted_storages"]),
               memory_options=tuple(tuple(pair) for pair in run["memory_options"]),
               failure=None if run["failure"] is None else Failure(**run["failure"]))
    columns = record["recomputations"]
    recomputations = tuple(Recomputation(*values) for values in zip(*(columns[f.name]
                                                                     for f in dataclasses.fields(Recomputation))))
    timeline = record["memory_timeline"]
    return ExecuteResult(run=RunResult(**run), device=record["device"], wall_seconds=record["wall_seconds"],
                         recomputations=recomputations, allocator=record["allocator"],
                         memory_timeline=tuple(zip(timeline["accounted"], timeline["resident"])))


def save_record(directory: str | os.PathLike, result: ExecuteResult, key: dict) -> Path:
    """Write ``result``'s record atomically to :func:`record_path` (then list it in a manifest to ship it)."""
    path = record_path(directory, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, to_record(result, key))
    return path


def load_shipped(bundle: str | os.PathLike, key: dict) -> tuple[ExecuteResult, dict] | None:
    """The shipped run of ``key`` and its ``made_on``, or None: when there is none, or (with a one-line
    warning) when its file does not match ``bundle/MANIFEST.json`` or holds another key."""
    path = record_path(Path(bundle) / SHIPPED_SUBDIR, key)
    if not path.is_file():
        return None
    try:
        verify_in_manifest(path, bundle)
        record = read_json(path)
        if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT or record.get("key") != key:
            raise IntegrityError(f"{path.name} is not the record of this run (another format or key)")
        return from_record(record), record["made_on"]
    except (OSError, IntegrityError, KeyError, TypeError) as exc:
        warnings.warn(f"ignoring the shipped real run {path.name}: {exc}; executing it for real", stacklevel=2)
        return None


def run_or_load(step: CapturedStep, budget_bytes: int, *, bundle: str | os.PathLike | None,
                save_to: str | os.PathLike | None = None, policy="dtr",
                semantics: Semantics = REFERENCE) -> ExecuteResult:
    """The shipped record of this run from ``bundle`` (:func:`load_shipped`), else ``run_step`` for real,
    with a one-line message either way; a real run's record is written to ``save_to`` when given."""
    key = record_key(step, budget_bytes, policy=policy, semantics=semantics)
    shipped = None if bundle is None else load_shipped(bundle, key)
    if shipped is not None:
        result, made_on = shipped
        print(f"{budget_bytes:,} B: the shipped real run ({result.status}; wall times measured on "
              f"{made_on['machine']} with {made_on['cpus']} CPUs, {made_on['date']})")
        return result
    print(f"{budget_bytes:,} B: executing {step.source} for real (no shipped record of this run) ...", flush=True)
    result = run_step(step, budget_bytes=budget_bytes, policy=policy, semantics=semantics)
    print(f"{budget_bytes:,} B: {result.status} in {result.wall_seconds:.1f} s", flush=True)
    if save_to is not None:
        save_record(save_to, result, key)
    return result
