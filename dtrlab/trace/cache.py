"""The parsed-trace cache: a log the compiled reader does not take (a gzip-compressed one, or one it leaves
to the Python parser) is parsed once, then loaded from a compact ``.npz``.

Layout: ``ROOT/traces-v{PARSER_VERSION}/{sha256 of the log file's bytes}-{start|all}.npz``
under the cache root shared with the sweep cache (``$DTRLAB_CACHE`` or
``~/.cache/dtrlab``). Each file is a NumPy ``.npz`` (a zip of ``.npy`` arrays:
``np.load(path)`` reads it) holding flat int64 arrays (operators, tensors,
schedule), the names as one NUL-separated UTF-8 blob, and a JSON header with the
parser version, the log's hash and the ``start`` flag. It is written and read here
with the standard library alone, so loading a trace imports neither numpy nor
pandas, and nothing is ever pickled. A file is used only if

* the header's parser version and log hash are those asked for (a stale file, or
  one copied under another name, is rebuilt), and
* it reads back whole: a last member, ``sha256.npy``, holds the sha256 of every
  other member's name and bytes (besides the zip's own CRC-32s); the file must be
  byte for byte the archive those members make (fixed timestamps), so a flip in a
  zip field the reader ignores counts too; and every array's ``.npy`` header must
  be the exact one this module writes. A damaged file (any
  error while reading or checking it, whatever its kind) is a miss: the log is
  parsed again and the entry rewritten, with a one-line warning.

Files are written atomically (:func:`dtrlab.integrity.atomic_write_bytes`); a cache
directory that cannot be written only costs the next run a parse.

Bump :data:`PARSER_VERSION` whenever :mod:`dtrlab.trace.simrd_log` can build a
different trace from the same log.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import sys
import warnings
import zipfile
from array import array
from itertools import chain
from pathlib import Path

from ..integrity import IntegrityError, atomic_write_bytes, remove_stale, sha256_bytes
from .model import Operator, Trace

#: Version of the log parser's output; part of every cache key.
#: 2: negative MEMORY or TIME refused (an entry parsed by 1 may hold them); 3: fields of the wrong JSON
#: type and numbers beyond 64 bits refused.
PARSER_VERSION = 3

CACHE_ENV = "DTRLAB_CACHE"
_FORMAT = "dtrlab-trace"
_SEPARATOR = "\x00"
_NPY_MAGIC = b"\x93NUMPY\x01\x00"
#: array typecode -> .npy descr (int64 little-endian; bytes)
_DESCR = {"q": "<i8", "B": "|u1"}
#: The member holding the sha256 of all the others (written last).
_CHECKSUM = "sha256.npy"


def default_cache_dir() -> Path:
    """``$DTRLAB_CACHE`` if set, else ``~/.cache/dtrlab`` (shared by every dtrlab cache)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "dtrlab")


def file_digest(data: bytes) -> str:
    """sha256 of a log file's bytes: the cache key (a changed log is a new entry)."""
    return sha256_bytes(data)


def cache_path(root: str | os.PathLike, digest: str, start: bool) -> Path:
    return Path(root) / f"traces-v{PARSER_VERSION}" / f"{digest}-{'start' if start else 'all'}.npz"


def _npy_header(typecode: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` (format 1.0) header of a C-ordered array, padded to 64 bytes as numpy does."""
    shape_text = f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"
    text = f"{{'descr': '{_DESCR[typecode]}', 'fortran_order': False, 'shape': {shape_text}, }}"
    padding = -(len(_NPY_MAGIC) + 2 + len(text) + 1) % 64
    text = text + " " * padding + "\n"
    return _NPY_MAGIC + struct.pack("<H", len(text)) + text.encode("latin1")


def _npy(values: array, shape: tuple[int, ...] | None = None) -> bytes:
    if values.itemsize > 1 and sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return _npy_header(values.typecode, shape or (len(values),)) + values.tobytes()


def _from_npy(data: bytes, typecode: str, columns: int | None = None) -> array:
    """The values of a ``.npy`` member written by :func:`_npy` (anything else is rejected)."""
    if data[:8] != _NPY_MAGIC:
        raise ValueError("not a .npy member")
    header_end = 10 + struct.unpack("<H", data[8:10])[0]
    values = array(typecode)
    values.frombytes(data[header_end:])
    if values.itemsize > 1 and sys.byteorder != "little":
        values.byteswap()
    shape = (len(values),) if columns is None else (len(values) // columns, columns)
    if data[:header_end] != _npy_header(typecode, shape) or (columns and len(values) % columns):
        raise ValueError("unexpected .npy header")
    return values


def _offsets(groups) -> array:
    offsets, total = array("q", [0]), 0
    for group in groups:
        total += len(group)
        offsets.append(total)
    return offsets


def _split(flat: list[int], offsets: list[int]) -> list[tuple[int, ...]]:
    return [tuple(flat[a:b]) for a, b in zip(offsets, offsets[1:])]


def _names_blob(names) -> array | None:
    """Names as one NUL-separated UTF-8 blob; None when a name holds a NUL (not cacheable)."""
    if any(_SEPARATOR in name for name in names):
        return None
    return array("B", _SEPARATOR.join(names).encode("utf-8"))


def _names(blob: array | bytes, count: int) -> list[str]:
    names = bytes(blob).decode("utf-8").split(_SEPARATOR) if count else []
    if len(names) != count:
        raise ValueError(f"{len(names)} names where {count} were stored")
    return names


def trace_members(trace: Trace, digest: str, start: bool) -> dict[str, bytes] | None:
    """The ``.npy`` members that store ``trace`` (None if it cannot be stored, see :func:`_names_blob`)."""
    operators = trace.operators
    op_names = _names_blob([op.name for op in operators])
    tensor_names = _names_blob(trace.tensor_names)
    if op_names is None or tensor_names is None:
        return None
    header = {"format": _FORMAT, "parser_version": PARSER_VERSION, "file_sha256": digest, "start": start,
              "operators": len(operators), "tensors": trace.n_tensors}
    flat = lambda groups: array("q", chain.from_iterable(groups))  # noqa: E731
    members = {
        "header": array("B", json.dumps(header, sort_keys=True).encode()),
        "op_names": op_names,
        "op_cost": array("q", (op.cost for op in operators)),
        "op_backward": array("q", (op.backward for op in operators)),
        "op_args": flat(op.args for op in operators),
        "op_args_offsets": _offsets([op.args for op in operators]),
        "op_outputs": flat(op.outputs for op in operators),
        "op_sizes": flat(op.sizes for op in operators),
        "op_aliases": flat(op.aliases for op in operators),
        "op_outputs_offsets": _offsets([op.outputs for op in operators]),
        "tensor_names": tensor_names,
        "tensor_op": array("q", trace.tensor_op),
        "tensor_index": array("q", trace.tensor_index),
    }
    stored = {f"{key}.npy": _npy(values) for key, values in members.items()}
    stored["schedule.npy"] = _npy(array("q", chain.from_iterable(trace.schedule)), (len(trace.schedule), 2))
    return stored


def json_member(document) -> bytes:
    """A JSON document as a ``.npy`` member of UTF-8 bytes (as the header is stored)."""
    return _npy(array("B", json.dumps(document, sort_keys=True).encode()))


def json_from_member(data: bytes):
    return json.loads(_from_npy(data, "B").tobytes())


def _members_digest(members: dict[str, bytes]) -> str:
    """sha256 over every member's name and bytes but the checksum's own, in a fixed order."""
    digest = hashlib.sha256()
    for member in sorted(set(members) - {_CHECKSUM}):
        digest.update(f"{member}\0{len(members[member])}\0".encode())
        digest.update(members[member])
    return digest.hexdigest()


def trace_from_members(members: dict[str, bytes], name: str, source: str) -> Trace:
    """Rebuild the trace stored by :func:`trace_members`."""
    header = json_from_member(members["header.npy"])
    flat = {key: _from_npy(members[f"{key}.npy"], "B" if key in _NAME_BLOBS else "q") for key in _FLAT_KEYS}
    flat["schedule"] = _from_npy(members["schedule.npy"], "q", columns=2)
    return trace_from_flat(flat, header["operators"], header["tensors"], name, source)


#: The flat arrays a trace is stored as (besides ``schedule``, the steps' (kind, operand) pairs in a row).
_FLAT_KEYS = ("op_names", "op_cost", "op_backward", "op_args", "op_args_offsets", "op_outputs", "op_sizes",
              "op_aliases", "op_outputs_offsets", "tensor_names", "tensor_op", "tensor_index")
_NAME_BLOBS = {"op_names", "tensor_names"}


def trace_from_flat(flat: dict[str, array | bytes], operators: int, tensors: int, name: str, source: str) -> Trace:
    """The trace (Python ints and tuples, as parsed) of its flat arrays: the cache's members, or the
    compiled log reader's (:mod:`dtrlab.trace._logparse`) native int64 bytes and NUL-separated names."""
    def ints(key: str) -> list[int]:
        return memoryview(flat[key]).cast("B").cast("q").tolist()

    op_names = _names(flat["op_names"], operators)
    args = _split(ints("op_args"), ints("op_args_offsets"))
    output_offsets = ints("op_outputs_offsets")
    outputs = _split(ints("op_outputs"), output_offsets)
    sizes = _split(ints("op_sizes"), output_offsets)
    aliases = _split(ints("op_aliases"), output_offsets)
    costs = ints("op_cost")
    backward = [bool(flag) for flag in ints("op_backward")]
    if not len(op_names) == len(args) == len(outputs) == len(costs) == len(backward):
        raise ValueError("operator arrays of different lengths")
    schedule = ints("schedule")
    return Trace(
        name=name, operators=tuple(map(Operator, op_names, costs, args, outputs, sizes, aliases, backward)),
        tensor_names=tuple(_names(flat["tensor_names"], tensors)),
        tensor_op=tuple(ints("tensor_op")), tensor_index=tuple(ints("tensor_index")),
        schedule=tuple(zip(schedule[0::2], schedule[1::2])), source=source,
    )


def sealed_archive(members: dict[str, bytes]) -> bytes:
    """The ``.npz`` of ``members`` and, last, the checksum member (the sha256 of all of them)."""
    return _archive({**members, _CHECKSUM: _npy(array("B", _members_digest(members).encode()))})


def read_sealed(data: bytes) -> dict[str, bytes]:
    """The members of an archive :func:`sealed_archive` made, checked: the zip's CRC-32s, the checksum member, and
    the archive those members make byte for byte. A damaged archive raises (IntegrityError, or whatever a damaged
    zip raises; a KeyError naming the checksum member when it is missing)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = {member: archive.read(member) for member in archive.namelist()}  # CRC-checked
    if _from_npy(members[_CHECKSUM], "B").tobytes().decode("ascii") != _members_digest(members):
        raise IntegrityError("its members do not match their sha256")
    if _archive(members) != data:  # a flip in a zip field the reader ignores (a timestamp, an attribute)
        raise IntegrityError("not the archive its members make")
    return members


def damage_reason(exc: BaseException) -> str:
    """One short phrase for why :func:`read_sealed` (or what reads its members) refused an archive."""
    if isinstance(exc, KeyError) and _CHECKSUM in str(exc):
        return "written without a checksum"
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def _archive(members: dict[str, bytes]) -> bytes:
    """The ``.npz`` of ``members``, byte for byte the same for the same members (fixed timestamps), so a
    read can check every byte of the file, the zip's own fields too."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for member, data in members.items():
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def load_cached(path: Path, digest: str, start: bool, name: str, source: str) -> Trace | None:
    """The trace cached at ``path`` if it is whole and of this log and parser version, else None.

    A damaged file (any exception while reading or checking it) is reported in a one-line warning
    and is a miss like a stale one: the caller parses the log and overwrites the entry.
    """
    try:
        members = read_sealed(path.read_bytes())
        header = json_from_member(members["header.npy"])
        if (header.get("format"), header.get("parser_version"), header.get("file_sha256"), header.get("start")) != (
                _FORMAT, PARSER_VERSION, digest, start):
            return None
        return trace_from_members(members, name, source)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except Exception as exc:  # noqa: BLE001  (whatever a damaged zip raises, the entry is rebuilt, never fatal)
        warnings.warn(f"ignoring damaged trace cache entry {path} ({damage_reason(exc)}); parsing the log again",
                      stacklevel=3)
        return None


def store(path: Path, trace: Trace, digest: str, start: bool) -> None:
    """Write ``trace`` to ``path`` atomically; a cache that cannot be written only costs the next run a parse."""
    members = trace_members(trace, digest, start)
    if members is None:
        return
    remove_stale(path.parent)  # what killed writes left, once old
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, sealed_archive(members))
    except OSError as exc:
        warnings.warn(f"could not write the trace cache {path} ({exc}); the log will be parsed again next time",
                      stacklevel=3)
