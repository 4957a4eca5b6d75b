"""Frontier files (parquet, written atomically, verified on read) and the solve journal (one
checksummed JSON file per finished solve), so that an interrupted run resumes."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ...integrity import (IntegrityError, atomic_write_bytes, quarantine, read_hashed, remove_stale, sha256_bytes,
                          write_hashed)
from ...trace.model import Trace
from .plan import FrontierPlan
from .result import COLUMNS, FRONTIER_VERSION, Frontier, _base_compute, _key, _plain, _records, assemble

_METADATA_KEY = b"dtrlab.frontier"


class StaleFrontier(ValueError):
    """A frontier file from another version, for another trace content, or damaged."""


def _content_sha256(meta: dict, records: list[dict]) -> str:
    """The checksum of what a file says: its metadata (less the checksum) and its rows as read."""
    meta = {k: v for k, v in meta.items() if k != "sha256"}
    return sha256_bytes(json.dumps({"meta": meta, "rows": records}, sort_keys=True, separators=(",", ":")).encode())


def write_frontier(frontier: Frontier, path: str | os.PathLike) -> Path:
    """Write ``frontier`` as parquet, atomically, with a checksum of its content in the metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = frontier.metadata()
    meta["sha256"] = _content_sha256(meta, _records(frontier.rows))
    table = pa.Table.from_pandas(frontier.rows, preserve_index=False)
    table = table.replace_schema_metadata({_METADATA_KEY: json.dumps(meta).encode()})  # no pandas metadata: arrow types
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def read_frontier(path: str | os.PathLike, trace: Trace | None = None) -> Frontier:
    """Read a frontier file, checking its version, its content's checksum and, with ``trace``,
    its content hash; the rows are audited again (:func:`audit_rows`) and the bracket is
    the one they support. A file that fails a check raises :class:`StaleFrontier`."""
    try:
        table = pq.read_table(path)
        raw = (table.schema.metadata or {}).get(_METADATA_KEY)
        meta = None if raw is None else json.loads(raw)
        rows = table.to_pandas()
    except FileNotFoundError:
        raise
    except Exception as error:  # noqa: BLE001  (whatever a damaged file makes the decoder raise)
        raise StaleFrontier(f"{path} is damaged (not a readable frontier file: {type(error).__name__}: "
                            f"{error})") from None
    if not isinstance(meta, dict):
        raise StaleFrontier(f"{path} is not a dtrlab frontier file (no {_METADATA_KEY.decode()} metadata)")
    if meta.get("version") != FRONTIER_VERSION:
        raise StaleFrontier(f"{path} has frontier version {meta.get('version')}, this dtrlab writes "
                            f"{FRONTIER_VERSION}; recompute it (dtrlab frontier)")
    if trace is not None and meta.get("trace_hash") != trace.content_hash:
        raise StaleFrontier(f"{path} was computed for other content of trace {meta.get('trace')!r}; recompute it")
    missing = [c for c in COLUMNS if c not in rows and c != "fault"]  # files before the audit have no fault column
    if missing:
        raise StaleFrontier(f"{path} lacks columns {missing}")
    records = _records(rows)
    if "sha256" in meta and _content_sha256(meta, records) != meta["sha256"]:
        raise StaleFrontier(f"{path} is damaged (its content does not match its checksum); recompute it")
    try:
        plan = FrontierPlan.from_dict(meta["plan"]) if "plan" in meta else _plan_of_v3(meta)
        return assemble(meta["trace"], meta["trace_hash"], plan, relax_status=meta["relax_status"],
                        peak_bytes=meta["peak_bytes"], base_compute=meta.get("base_compute") or _base_compute(records),
                        lower_bound_bytes=meta["lower_bound_bytes"],
                        resolution_bytes=meta["resolution_bytes"], rows=records)
    except (KeyError, TypeError, ValueError) as error:
        raise StaleFrontier(f"{path} has damaged metadata ({type(error).__name__}: {error})") from None


def _plan_of_v3(meta: dict) -> FrontierPlan:
    """The plan of a file written before plans were recorded: the settings it kept."""
    return FrontierPlan(solver=meta["solver"], probe_solver=meta["probe_solver"], relax_method=meta["relax_method"],
                        overhead_limit=meta["overhead_limit"], time_limit_s=meta["time_limit_s"], chain=meta["chain"],
                        mip_probes=meta.get("mip_probes", 0),
                        resolution=min(0.5, max(1e-9, meta["resolution_bytes"] / meta["peak_bytes"])))


def frontier_path(directory: str | os.PathLike, trace_name: str) -> Path:
    return Path(directory) / f"{trace_name}.parquet"


class SolveJournal:
    """Each finished solve of one frontier as its own JSON file in ``directory``, so an
    interrupted computation (Ctrl-C, SIGKILL) loses nothing that finished.

    An entry is written atomically under a name holding the sha256 of its bytes
    (:func:`dtrlab.integrity.write_hashed`) and verified when read; a damaged one is moved
    aside with a warning and its solve is done again. Each entry records the trace's
    content hash, :data:`FRONTIER_VERSION` and the limits a solve depends on
    (``overhead_limit``, ``time_limit_s``); :meth:`rows` refuses entries of others.
    """

    def __init__(self, directory: str | os.PathLike, trace: Trace, plan: FrontierPlan):
        self.directory = Path(directory)
        self.stamp = {"version": FRONTIER_VERSION, "trace_hash": trace.content_hash,
                      "overhead_limit": plan.overhead_limit, "time_limit_s": plan.time_limit_s}
        self._written: set[tuple] = set()

    def entries(self) -> list[Path]:
        return sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []

    def add(self, row: dict) -> None:
        key = _key(row)
        if key in self._written:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps({**self.stamp, "row": {c: _plain(row.get(c)) for c in COLUMNS}}, sort_keys=True)
        kind, solver, budget = key
        write_hashed(self.directory, f"{kind}-{solver}-{budget}", ".json", data.encode())
        self._written.add(key)

    def rows(self) -> list[dict]:
        """The verified rows of the entries (damaged ones quarantined); raises ``ValueError``
        if an entry was made for another trace content or with other limits. Old leftovers of
        killed writes and of earlier quarantines are removed first (:func:`~dtrlab.integrity.remove_stale`)."""
        remove_stale(self.directory)
        rows = {}
        for path in self.entries():
            try:
                entry = json.loads(read_hashed(path))
                stamp = {k: entry[k] for k in self.stamp}
                row = {c: entry["row"].get(c) for c in COLUMNS}
            except FileNotFoundError:
                continue
            except (IntegrityError, ValueError, KeyError, TypeError, AttributeError) as error:
                quarantine(path, str(error))
                continue
            if stamp != self.stamp:
                raise ValueError(f"{path} was computed with {stamp}, not {self.stamp}; give the same limits, "
                                 f"or delete {self.directory}")
            rows[_key(row)] = row
            self._written.add(_key(row))
        return list(rows.values())

    def clear(self) -> None:
        """Remove the entries (after their frontier file is written) and the directory if empty."""
        for path in self.entries():
            path.unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:
            pass  # not empty (quarantined files) or gone
