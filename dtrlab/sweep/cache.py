"""The on-disk result cache of sweeps: parquet files keyed by everything a result depends on.

Layout: ``ROOT/sim-v{SIMULATOR_VERSION}/{trace content hash}/{config key}/``, where
the config key hashes the policy (class, label and parameters, plus the source of
policies defined outside dtrlab), the overhead limit and the intervention (withheld
storages, timed pins and forced evictions). Inside,
every row is one budget. Each batch of finished results is written at once as its
own small ``part-{sha256}.parquet`` (atomically, :mod:`dtrlab.integrity`), so a
killed sweep loses nothing that finished; :meth:`SweepCache.compact` merges the
parts into one ``merged-{sha256}.parquet`` at the end of a sweep. A simulator
version bump changes the directory, and rows are also checked for their stored
version, so an older simulator's results are never reused.

Checked, not trusted: every file's name holds the sha256 of its bytes, verified
on every read. A damaged file (a flipped bit, a truncation, a file without a
checksum) is never served: it is moved aside (``*.damaged``) with a one-line
warning and its budgets are simulated again. A cache directory that cannot be
written (permissions, a full disk) turns the cache off for the rest of the sweep
with one warning; nothing half-written is ever left.

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
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..integrity import IntegrityError, atomic_write_json, quarantine, read_hashed, read_json, write_hashed
from ..policies import Policy
from ..runtime import REFERENCE, SIMULATOR_VERSION, Intervention, Semantics
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
    fingerprint = {"class": cls.cache_class or f"{cls.__module__}.{cls.__qualname__}", "label": policy.label,
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


def config_key(key: dict) -> str:
    """The configuration directory's name: a hash of the key's policy, overhead limit, intervention and memory."""
    config = {k: key[k] for k in ("policy", "overhead_limit", "withhold", "pin", "force_evict", "memory",
                                  "memory_options", "enforce", "device_capacity") if k in key}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:24]


class SweepCache:
    """The cached results of one (trace, policy, semantics, intervention); ``semantics`` is keyed as
    :meth:`~dtrlab.runtime.semantics.Semantics.normalized` gives it (the model's effective options, the
    device capacity's label)."""

    def __init__(self, root: str | os.PathLike, trace: Trace, policy: Policy, semantics: Semantics = REFERENCE,
                 intervention: Intervention | None = None):
        semantics = semantics.normalized()
        overhead_limit, memory, memory_options = semantics.overhead_limit, semantics.memory, semantics.options
        self.key = {
            "simulator_version": SIMULATOR_VERSION, "trace": trace.name, "trace_hash": trace.content_hash,
            # No limit (math.inf) is JSON's Infinity, which Python's json writes and reads back: its own key,
            # and every finite limit's key stays as it was.
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
        # So does a runtime semantics other than the default "reserved" (with its device capacity's label).
        if semantics.enforce != "reserved":
            self.key["enforce"] = semantics.enforce
            self.key["device_capacity"] = semantics.device_capacity
        self.config_key = config_key(self.key)
        self.directory = Path(root) / f"sim-v{SIMULATOR_VERSION}" / trace.content_hash[:24] / self.config_key
        #: Set (with one warning) when the directory cannot be written: the sweep then runs uncached.
        self.unwritable = False
        self._key_written = False

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
        """The whole parts on disk and their rows (None when there is none); damaged ones are quarantined.

        Another process may compact this directory between the listing and the reads:
        its merged file then holds the vanished parts' rows, so list again.
        """
        for _ in range(10):
            parts, frames = [], []
            try:
                for part in self._parts():
                    frame = read_part(part)
                    if frame is not None:
                        parts.append(part)
                        frames.append(frame)
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
        """Store finished rows now (one new parquet part); a cache that cannot be written is turned off."""
        if not rows or self.unwritable:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._write_key()
            self._write(pa.Table.from_pylist(rows), "part")
        except OSError as exc:
            self._turn_off(exc)

    def _write_key(self) -> None:
        """``key.json``: the full key, for people and :func:`~dtrlab.sweep.shipped.rows_from_cache` (rewritten
        when missing or damaged)."""
        if self._key_written:
            return
        key_file = self.directory / "key.json"
        try:
            whole = read_json(key_file) == json.loads(json.dumps(self.key))
        except (FileNotFoundError, IntegrityError):
            whole = False
        if not whole:
            atomic_write_json(key_file, self.key)
        self._key_written = True

    def compact(self) -> None:
        """Merge the parts into one file. Safe beside other processes: only the parts whose
        rows are in the merged file are deleted, and a part another process compacted away
        meanwhile is read from that process's merged file instead."""
        if self.unwritable:
            return
        parts, frame = self._read_parts()
        if len(parts) <= 1:
            return
        try:
            merged = self._write(pa.Table.from_pandas(self._current(frame), preserve_index=False), "merged")
            for part in parts:
                if part != merged:  # the same rows merged before give the same file (content-addressed)
                    part.unlink(missing_ok=True)
        except OSError as exc:
            self._turn_off(exc)

    def _write(self, table: pa.Table, prefix: str) -> Path:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        return write_hashed(self.directory, prefix, ".parquet", sink.getvalue().to_pybytes())

    def _turn_off(self, exc: OSError) -> None:
        self.unwritable = True
        warnings.warn(f"cannot write the sweep cache {self.directory} ({exc}); running uncached", stacklevel=3)


def read_part(path: Path) -> pd.DataFrame | None:
    """The rows of one cache file, verified against the sha256 in its name; None (and the file
    quarantined) when it is damaged. Raises ``FileNotFoundError`` when it vanished."""
    try:
        return pq.read_table(pa.BufferReader(read_hashed(path))).to_pandas()
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001  (a damaged file is never served, and never fatal)
        reason = str(exc) if isinstance(exc, IntegrityError) else f"{type(exc).__name__}: {exc}"
        quarantine(path, reason.splitlines()[0][:300], stacklevel=4)
        return None


def rows_from_cache(cache_root: str | os.PathLike, trace_hash: str) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Every row a sweep cache holds for one trace under this simulator, with its configurations' keys.

    Returns the rows (cache columns + ``trace_hash`` and ``config_key``) and ``{config key: key.json +
    row_columns}`` (``row_columns``: the columns of that configuration's cached rows). Only verified
    files count: a damaged part is quarantined, and a configuration whose ``key.json`` is damaged or
    not its directory's is skipped with a warning.
    """
    trace_dir = Path(cache_root) / f"sim-v{SIMULATOR_VERSION}" / trace_hash[:24]
    frames, configs = [], {}
    for config_dir in sorted(trace_dir.iterdir()) if trace_dir.is_dir() else []:
        parts = sorted(config_dir.glob("*.parquet"))
        if not parts:
            continue
        try:
            key = read_json(config_dir / "key.json")
            whole = isinstance(key, dict) and key.get("trace_hash") == trace_hash and config_key(key) == config_dir.name
            problem = "its key.json is not this configuration's"
        except (OSError, IntegrityError) as exc:
            whole, problem = False, f"its key.json cannot be read ({exc})"
        if not whole:
            warnings.warn(f"skipping the cached rows in {config_dir}: {problem}", stacklevel=2)
            continue
        read = [frame for frame in map(read_part, parts) if frame is not None]
        if not read:
            continue
        frame = pd.concat(read, ignore_index=True)
        frame = frame[frame["simulator_version"] == SIMULATOR_VERSION]
        frame = frame.drop_duplicates("budget_bytes", keep="last")
        frames.append(frame.assign(trace_hash=trace_hash, config_key=config_dir.name))
        configs[config_dir.name] = {**key, "row_columns": list(frame.columns)}
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return rows, configs
