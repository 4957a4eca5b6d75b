"""The on-disk result cache of sweeps: parquet files keyed by everything a result depends on.

Layout: ``ROOT/sim-v{SIMULATOR_VERSION}/{trace content hash}/{config key}/``, where
the config key hashes the policy (class, label and parameters, plus the source of
policies defined outside dtrlab), the overhead limit and the intervention (withheld
storages, timed pins and forced evictions). Inside,
every row is one budget. Each batch of finished results is written at once as its
own small ``part-*.parquet`` (atomically: written under a temporary name, then
renamed), so a killed sweep loses nothing that finished; :meth:`SweepCache.compact`
merges the parts into one file at the end of a sweep. A simulator version bump
changes the directory, and rows are also checked for their stored version, so an
older simulator's results are never reused.

Below this writable cache lies a read-only **shipped layer**: the results the
notebooks need for the shipped traces and the DTR logs' census, committed as
compact parquet files in ``results/shipped/`` (one per trace; see
:mod:`dtrlab.sweep.shipped`). :meth:`SweepCache.load` returns the shipped rows of
its configuration under the cached ones; a shipped row is used only if its
simulator version, trace content hash and config key all match, so a stale row is
recomputed like a missing one. ``DTRLAB_RECOMPUTE=1`` ignores the shipped layer,
``DTRLAB_SHIPPED=DIR`` reads another bundle.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import uuid
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..policies import Policy
from ..runtime import SIMULATOR_VERSION, Intervention
from ..trace.cache import CACHE_ENV, default_cache_dir  # noqa: F401  (one cache root for all)
from ..trace.model import Trace
from .shipped import shipped_rows


def policy_fingerprint(policy: Policy) -> dict:
    """What identifies a policy's decisions: its class, label and parameters.

    A policy defined outside dtrlab (a notebook cell) may be edited without being
    renamed, so the source of its methods (and of functions they close over, as
    :func:`~dtrlab.policies.score_policy` does) is part of the key too.
    """
    cls = type(policy)
    fingerprint = {"class": f"{cls.__module__}.{cls.__qualname__}", "label": policy.label,
                   "params": json.dumps(policy.params, sort_keys=True, default=repr)}
    if not cls.__module__.startswith("dtrlab."):
        digest = hashlib.sha256()
        for klass in cls.__mro__:
            if klass.__module__.startswith("dtrlab.") or klass is object:
                continue
            for name, member in sorted(vars(klass).items()):
                if inspect.isfunction(member):
                    _hash_function(digest, member)
        fingerprint["source"] = digest.hexdigest()
    return fingerprint


def _hash_function(digest, fn) -> None:
    try:
        digest.update(inspect.getsource(fn).encode())
    except (OSError, TypeError):
        digest.update(fn.__code__.co_code + repr(fn.__code__.co_consts).encode())
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.isfunction(value):
            _hash_function(digest, value)


class SweepCache:
    """The cached results of one (trace, policy, overhead limit, intervention)."""

    def __init__(self, root: str | os.PathLike, trace: Trace, policy: Policy, overhead_limit: float,
                 intervention: Intervention | None = None, memory: str = "flat", memory_options: dict | None = None):
        self.key = {
            "simulator_version": SIMULATOR_VERSION, "trace": trace.name, "trace_hash": trace.content_hash,
            "policy": policy_fingerprint(policy), "overhead_limit": float(overhead_limit),
            "withhold": sorted(intervention.withhold) if intervention else [],
        }
        # Timed pins and forced evictions change results too; they join the key only when
        # present, so the keys of sweeps without them stay as they were.
        if intervention and (intervention.pin or intervention.force_evict):
            self.key["pin"] = [list(pair) for pair in intervention.pin]
            self.key["force_evict"] = [list(pair) for pair in intervention.force_evict]
        # So does a memory model other than flat (with its effective options); flat keys stay as they were.
        if memory != "flat" or memory_options:
            self.key["memory"] = memory
            self.key["memory_options"] = dict(memory_options or {})
        config = {k: self.key[k] for k in ("policy", "overhead_limit", "withhold", "pin", "force_evict", "memory",
                                           "memory_options") if k in self.key}
        self.config_key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:24]
        self.directory = Path(root) / f"sim-v{SIMULATOR_VERSION}" / trace.content_hash[:24] / self.config_key

    def _parts(self) -> list[Path]:
        return sorted(self.directory.glob("*.parquet")) if self.directory.is_dir() else []

    def load(self) -> pd.DataFrame:
        """Every cached or shipped row, one per budget (empty frame when there is none).

        The writable cache's row wins over a shipped row of the same budget.
        """
        frames = [f for f in (shipped_rows(self.key["trace_hash"], self.config_key), self._cached()) if len(f)]
        if not frames:
            return pd.DataFrame()
        return pd.concat(frames, ignore_index=True).drop_duplicates("budget_bytes", keep="last").reset_index(drop=True)

    def _read_parts(self) -> tuple[list[Path], pd.DataFrame | None]:
        """The parts on disk and their rows (None when there is none).

        Another process may compact this directory between the listing and the reads:
        its merged file then holds the vanished parts' rows, so list again.
        """
        for _ in range(10):
            parts = self._parts()
            try:
                frames = [pd.read_parquet(p) for p in parts]
            except FileNotFoundError:
                continue
            return parts, pd.concat(frames, ignore_index=True) if frames else None
        raise RuntimeError(f"the cache {self.directory} kept changing while it was read; is another process "
                           "compacting it in a loop?")

    def _cached(self) -> pd.DataFrame:
        """The rows of the writable cache (this simulator version's only)."""
        return self._current(self._read_parts()[1])

    def _current(self, frame: pd.DataFrame | None) -> pd.DataFrame:
        if frame is None:
            return pd.DataFrame()
        stale = frame["simulator_version"] != SIMULATOR_VERSION
        if stale.any():
            warnings.warn(f"ignoring {int(stale.sum())} cached rows in {self.directory} written by another "
                          f"simulator version (current: {SIMULATOR_VERSION})", stacklevel=2)
            frame = frame[~stale]
        return frame.drop_duplicates("budget_bytes", keep="last").reset_index(drop=True)

    def append(self, rows: list[dict]) -> None:
        """Store finished rows now (one new parquet part)."""
        if not rows:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        key_file = self.directory / "key.json"
        if not key_file.exists():
            key_file.write_text(json.dumps(self.key, indent=1, sort_keys=True))
        self._write(pa.Table.from_pylist(rows), f"part-{uuid.uuid4().hex}.parquet")

    def compact(self) -> None:
        """Merge the parts into one file. Safe beside other processes: only the parts whose
        rows are in the merged file are deleted, and a part another process compacted away
        meanwhile is read from that process's merged file instead."""
        parts, frame = self._read_parts()
        if len(parts) <= 1:
            return
        self._write(pa.Table.from_pandas(self._current(frame), preserve_index=False),
                    f"merged-{uuid.uuid4().hex}.parquet")
        for part in parts:
            part.unlink(missing_ok=True)

    def _write(self, table: pa.Table, name: str) -> None:
        temporary = self.directory / f".{name}.tmp"
        pq.write_table(table, temporary)
        os.replace(temporary, self.directory / name)
