"""The parsed-trace cache: a log is parsed once, then loaded from a compact ``.npz``.

Layout: ``ROOT/traces-v{PARSER_VERSION}/{sha256 of the log file's bytes}-{start|all}.npz``
under the cache root shared with the sweep cache (``$DTRLAB_CACHE`` or
``~/.cache/dtrlab``). Each file holds flat integer arrays (operators, tensors,
schedule), the names as one NUL-separated UTF-8 blob, and a JSON header with the
parser version, the log's hash and the ``start`` flag. It is never pickled
(``np.load(allow_pickle=False)``), and it is used only if

* the header's parser version and log hash are those asked for (a stale file, or
  one copied under another name, is rebuilt), and
* the archive reads back whole: ``.npz`` is a zip whose members carry CRC-32
  checksums, so a truncated or bit-flipped file fails to load and is rebuilt.

Bump :data:`PARSER_VERSION` whenever :mod:`dtrlab.trace.simrd_log` can build a
different trace from the same log. This module must stay light (numpy, no pandas):
``dtrlab run`` loads traces through it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
import warnings
import zipfile
from pathlib import Path

import numpy as np

from .model import Operator, Trace

#: Version of the log parser's output; part of every cache key.
PARSER_VERSION = 1

CACHE_ENV = "DTRLAB_CACHE"
_FORMAT = "dtrlab-trace"
_SEPARATOR = "\x00"


def default_cache_dir() -> Path:
    """``$DTRLAB_CACHE`` if set, else ``~/.cache/dtrlab`` (shared by every dtrlab cache)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "dtrlab")


def file_digest(data: bytes) -> str:
    """sha256 of a log file's bytes: the cache key (a changed log is a new entry)."""
    return hashlib.sha256(data).hexdigest()


def cache_path(root: str | os.PathLike, digest: str, start: bool) -> Path:
    return Path(root) / f"traces-v{PARSER_VERSION}" / f"{digest}-{'start' if start else 'all'}.npz"


def _offsets(groups) -> np.ndarray:
    lengths = np.fromiter((len(g) for g in groups), dtype=np.int64)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _flat(groups) -> np.ndarray:
    return np.fromiter((x for g in groups for x in g), dtype=np.int64)


def _split(flat: list[int], offsets: list[int]) -> list[tuple[int, ...]]:
    return [tuple(flat[a:b]) for a, b in zip(offsets, offsets[1:])]


def _names_blob(names) -> np.ndarray | None:
    """Names as one NUL-separated UTF-8 blob; None when a name holds a NUL (not cacheable)."""
    if any(_SEPARATOR in name for name in names):
        return None
    return np.frombuffer(_SEPARATOR.join(names).encode("utf-8"), dtype=np.uint8)


def _names(blob: np.ndarray, count: int) -> list[str]:
    names = blob.tobytes().decode("utf-8").split(_SEPARATOR) if count else []
    if len(names) != count:
        raise ValueError(f"{len(names)} names where {count} were stored")
    return names


def trace_arrays(trace: Trace, digest: str, start: bool) -> dict[str, np.ndarray] | None:
    """The arrays that store ``trace`` (None if it cannot be stored, see :func:`_names_blob`)."""
    operators = trace.operators
    op_names = _names_blob([op.name for op in operators])
    tensor_names = _names_blob(trace.tensor_names)
    if op_names is None or tensor_names is None:
        return None
    header = {"format": _FORMAT, "parser_version": PARSER_VERSION, "file_sha256": digest, "start": start,
              "operators": len(operators), "tensors": trace.n_tensors}
    return {
        "header": np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8),
        "op_names": op_names,
        "op_cost": np.fromiter((op.cost for op in operators), dtype=np.int64, count=len(operators)),
        "op_backward": np.fromiter((op.backward for op in operators), dtype=np.bool_, count=len(operators)),
        "op_args": _flat(op.args for op in operators),
        "op_args_offsets": _offsets([op.args for op in operators]),
        "op_outputs": _flat(op.outputs for op in operators),
        "op_sizes": _flat(op.sizes for op in operators),
        "op_aliases": _flat(op.aliases for op in operators),
        "op_outputs_offsets": _offsets([op.outputs for op in operators]),
        "tensor_names": tensor_names,
        "tensor_op": np.asarray(trace.tensor_op, dtype=np.int64),
        "tensor_index": np.asarray(trace.tensor_index, dtype=np.int64),
        "schedule": np.asarray(trace.schedule, dtype=np.int64).reshape(-1, 2),
    }


def trace_from_arrays(arrays, name: str, source: str) -> Trace:
    """Rebuild the trace stored by :func:`trace_arrays` (Python ints and tuples, as parsed)."""
    header = json.loads(arrays["header"].tobytes())
    op_names = _names(arrays["op_names"], header["operators"])
    args = _split(arrays["op_args"].tolist(), arrays["op_args_offsets"].tolist())
    output_offsets = arrays["op_outputs_offsets"].tolist()
    outputs = _split(arrays["op_outputs"].tolist(), output_offsets)
    sizes = _split(arrays["op_sizes"].tolist(), output_offsets)
    aliases = _split(arrays["op_aliases"].tolist(), output_offsets)
    costs = arrays["op_cost"].tolist()
    backward = arrays["op_backward"].tolist()
    if not len(op_names) == len(args) == len(outputs) == len(costs) == len(backward):
        raise ValueError("operator arrays of different lengths")
    operators = tuple(map(Operator, op_names, costs, args, outputs, sizes, aliases, backward))
    return Trace(
        name=name, operators=operators, tensor_names=tuple(_names(arrays["tensor_names"], header["tensors"])),
        tensor_op=tuple(arrays["tensor_op"].tolist()), tensor_index=tuple(arrays["tensor_index"].tolist()),
        schedule=tuple(zip(arrays["schedule"][:, 0].tolist(), arrays["schedule"][:, 1].tolist())), source=source,
    )


def load_cached(path: Path, digest: str, start: bool, name: str, source: str) -> Trace | None:
    """The trace cached at ``path`` if it is whole and of this log and parser version, else None."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}  # reads every member: CRC-checked
        header = json.loads(arrays["header"].tobytes())
        if (header.get("format"), header.get("parser_version"), header.get("file_sha256"), header.get("start")) != (
                _FORMAT, PARSER_VERSION, digest, start):
            return None
        return trace_from_arrays(arrays, name, source)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, json.JSONDecodeError,
            UnicodeDecodeError):
        return None  # truncated, corrupted or of another layout: rebuilt by the caller


def store(path: Path, trace: Trace, digest: str, start: bool) -> None:
    """Write ``trace`` to ``path`` atomically (temporary name, then rename); a cache
    that cannot be written only costs the next run a parse."""
    arrays = trace_arrays(trace, digest, start)
    if arrays is None:
        return
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(buffer.getvalue())
        os.replace(temporary, path)
    except OSError as exc:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass  # the directory itself is unusable: nothing was written
        warnings.warn(f"could not write the trace cache {path} ({exc}); the log will be parsed again next time",
                      stacklevel=3)
