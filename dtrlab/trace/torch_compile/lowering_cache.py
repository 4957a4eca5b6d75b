"""Inductor's lowered steps kept on disk across runs: a partition lowered once is never lowered again.

What is kept is what the accounting reads from a lowering (:func:`dtrlab.trace.torch_compile.inductor.record_lowered`):
the step's trace (the allocations, views and calls the generated wrappers made under the recorder), the peak the
recorder counted, the forward's operator count and the trace's metadata. No Python object is pickled: the trace
is stored as the parsed-trace cache stores one (:mod:`dtrlab.trace.cache`: flat int64 arrays and name blobs in a
``.npz``), beside a JSON member with the rest.

Layout: ``ROOT/inductor-v{LOWERING_VERSION}/{key}.npz`` under the cache root shared by every dtrlab cache
(``$DTRLAB_CACHE`` or ``~/.cache/dtrlab``). ``key`` (:func:`dtrlab.trace.torch_compile.inductor.disk_key`) is the sha256
of the partitioned graphs, the joint graph they come from, Inductor's and AOT autograd's configuration, torch's
version, the device Inductor lowers for and the rules a step is recorded by.

An entry is used only if it reads back whole (:func:`dtrlab.trace.cache.read_sealed`: the zip's CRC-32s, a
sha256 member over every other member, the file byte for byte the archive its members make) and its JSON
names this format, version and key. Anything else is a damaged entry: moved aside
(:func:`dtrlab.integrity.quarantine`, one warning), lowered again and rewritten; it is never served. Entries
are written atomically; a cache that cannot be written only costs the next run a lowering.

Bump :data:`LOWERING_VERSION` when what is stored, or how a lowering is turned into it, changes.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ...integrity import IntegrityError, atomic_write_bytes, quarantine, remove_stale
from ..cache import (damage_reason, default_cache_dir, json_from_member, json_member, read_sealed, sealed_archive,
                     trace_from_members, trace_members)
from ..model import Trace

#: The stored record's format; part of every key and of every entry's JSON.
LOWERING_VERSION = 1
LOWERING_FORMAT = "dtrlab-inductor-lowering"
#: The folder of the entries under the cache root.
FOLDER = f"inductor-v{LOWERING_VERSION}"
_RECORD = "lowering.npy"

#: What the accounting reads from a lowered step: (trace, recorded peak bytes, forward operator count).
Record = tuple[Trace, int, int]


def lowering_directory(cache) -> Path | None:
    """Where lowerings are kept: ``cache`` True for the default root (``$DTRLAB_CACHE`` or ``~/.cache/dtrlab``), a
    directory (its root), or False/None for none."""
    if cache is False or cache is None:
        return None
    return (default_cache_dir() if cache is True else Path(cache)) / FOLDER


def entry_path(cache, key: str) -> Path | None:
    directory = lowering_directory(cache)
    return None if directory is None else directory / f"{key}.npz"


def load_record(path: Path, key: str, name: str, source: str) -> Record | None:
    """The record stored at ``path`` under ``key`` (the trace named ``name`` and ``source``), or None: missing, or
    damaged (moved aside with a warning; the caller lowers again and rewrites it)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        members = read_sealed(data)
        document = json_from_member(members[_RECORD])
        if (document.get("format"), document.get("version"), document.get("key")) != (
                LOWERING_FORMAT, LOWERING_VERSION, key):
            raise IntegrityError("another format, version or key than its name says")
        trace = trace_from_members(members, name, source)
        meta = document["meta"]
        meta["node_names"] = tuple(meta["node_names"])
        if len(meta["node_names"]) != len(trace.operators):
            raise IntegrityError("node names and operators of different counts")
        trace.meta.update(meta)
        return trace, int(document["recorded_peak"]), int(document["forward_ops"])
    except Exception as exc:  # noqa: BLE001  (whatever a damaged entry raises, it is lowered again, never served)
        quarantine(path, f"Inductor lowering cache entry: {damage_reason(exc)}", stacklevel=3)
        return None


def store_record(path: Path, key: str, record: Record) -> None:
    """Write ``record`` to ``path`` atomically (a trace whose names cannot be stored is not kept)."""
    trace, recorded_peak, forward_ops = record
    members = trace_members(trace, key, False)
    if members is None:
        return
    meta = {**trace.meta, "node_names": list(trace.meta["node_names"])}
    try:
        members[_RECORD] = json_member({"format": LOWERING_FORMAT, "version": LOWERING_VERSION, "key": key,
                                        "recorded_peak": recorded_peak, "forward_ops": forward_ops, "meta": meta})
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path.parent)  # what killed writes left, once old
        atomic_write_bytes(path, sealed_archive(members))
    except (OSError, TypeError) as exc:  # TypeError: metadata JSON cannot hold
        warnings.warn(f"could not write the Inductor lowering cache {path} ({exc}); the partition will be lowered "
                      "again next time", stacklevel=3)


def cache_entries(root: str | os.PathLike) -> list[Path]:
    """The lowering entries under the cache root ``root`` (this version's)."""
    return sorted((Path(root) / FOLDER).glob("*.npz"))
