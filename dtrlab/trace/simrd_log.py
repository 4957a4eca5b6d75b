"""Loader for simrd's JSON-lines operator logs (the DTR artifact's format).

The replay schedule built here is the one simrd's ``parse_file(f, start=True)``
builds, with outputs rematerialized and pinned at the end:

* ``CONSTANT`` + ``MEMORY``: a zero-cost ``constant`` operator, then a pin;
* ``COPY dst src``: ``dst`` names the same tensor as ``src``; a get;
* ``RELEASE name``: a release (releases of unknown names are ignored, as simrd does);
* ``CALL``: an operator, followed by one ``MEMORY`` and one ``ALIAS`` line per result;
  an aliasing result has size 0;
* ``MUTATE``: an operator whose outputs are fresh storages (named ``arg$``) of the
  mutated arguments' storage sizes, then a release of each replaced tensor;
* ``COPY_FROM dst src``: release what ``dst`` named, ``dst`` now names ``src``; a get;
* ``ANNOTATE START`` / ``BACKWARD``: the start of the step and of the backward pass.

A plain log is read by the compiled reader (``_logparse.c``) when it takes it: it builds the same trace
and leaves every other log, valid or not, to :func:`parse_lines` (tests/test_logparse.py).

Every problem is reported as a :class:`TraceFormatError` that names the file and line:
malformed lines, negative sizes or times, a file that is not (or no longer) the gzip
or zip it claims to be, a manifest entry without its log, a zip without logs.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .model import COMPUTE, CONSTANT_OP, GET, PIN, RELEASE, Operator, Trace

try:
    from ._logparse import parse as _read_compiled
except ImportError:  # not built (a source tree without `pip install -e .`): the Python parser reads every log
    _read_compiled = None


class TraceFormatError(ValueError):
    """A log that cannot be read; the message names the file and the line."""

    def __init__(self, source: str, line_number: int | None, message: str):
        where = f"{source}:{line_number}" if line_number is not None else source
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line_number = line_number


_KNOWN = {"CONSTANT", "MEMORY", "COPY", "RELEASE", "CALL", "MUTATE", "ANNOTATE", "COPY_FROM", "ALIAS"}


class _Builder:
    """Accumulates operators, tensors and the schedule while reading a log."""

    def __init__(self, source: str):
        self.source = source
        self.operators: list[Operator] = []
        self.tensor_names: list[str] = []
        self.tensor_op: list[int] = []
        self.tensor_index: list[int] = []
        self.tensor_refs: list[int] = []  # parse-time reference counts, for the output pins
        self.schedule: list[tuple[int, int]] = []
        self.names: dict[str, int] = {}  # log name -> tensor id (released names stay, as in simrd)
        self.defined_tensor_names: set[str] = set()
        self.in_backward = False

    def error(self, line_number: int, message: str) -> TraceFormatError:
        return TraceFormatError(self.source, line_number, message)

    def lookup(self, name: str, line_number: int) -> int:
        try:
            return self.names[name]
        except KeyError:
            raise self.error(line_number, f"reference to undefined tensor {name!r}") from None

    def add_operator(self, name, cost, args, sizes, aliases, result_names, line_number) -> tuple[int, ...]:
        for result_name in result_names:
            # A tensor name is defined once; mutating one tensor twice (through two
            # names) would define "name$" twice, which simrd rejects too.
            if result_name in self.defined_tensor_names or result_names.count(result_name) > 1:
                raise self.error(line_number, f"tensor {result_name!r} is defined twice")
            self.defined_tensor_names.add(result_name)
        op_index = len(self.operators)
        outputs = tuple(range(len(self.tensor_names), len(self.tensor_names) + len(sizes)))
        for index, result_name in enumerate(result_names):
            self.tensor_names.append(result_name)
            self.tensor_op.append(op_index)
            self.tensor_index.append(index)
            self.tensor_refs.append(1)
        self.operators.append(
            Operator(name, cost, tuple(args), outputs, tuple(sizes), tuple(aliases), self.in_backward)
        )
        self.schedule.append((COMPUTE, op_index))
        return outputs

    def storage_size(self, tensor: int) -> int:
        """Bytes of the storage behind ``tensor`` (an alias's root storage)."""
        op = self.operators[self.tensor_op[tensor]]
        index = self.tensor_index[tensor]
        alias = op.aliases[index]
        return op.sizes[index] if alias == -1 else self.storage_size(op.args[alias])


#: The fields whose JSON type the parser relies on (a tensor name is a string; MUTATE lists argument
#: indices); TIME, MEMORY and ALIAS are integers or their strings, checked by _integer.
_NAME_FIELDS = {"NAME", "DST", "SRC"}
_NAME_LIST_FIELDS = {"ARGS", "RESULT"}
_is_str, _is_int = str.__instancecheck__, int.__instancecheck__  # isinstance(x, str) / (x, int) as fast callables


def _field(record: dict, key: str, source: str, line_number: int):
    try:
        value = record[key]
    except KeyError:
        raise TraceFormatError(source, line_number, f"{record.get('INSTRUCTION')} lacks field {key!r}") from None
    if key in _NAME_FIELDS:
        wrong = type(value) is not str
        expected = "a tensor name (a string)"
    elif key in _NAME_LIST_FIELDS:
        wrong = type(value) is not list or not all(map(_is_str, value))
        expected = "a list of tensor names (strings)"
    elif key == "MUTATE":
        wrong = type(value) is not list or not all(map(_is_int, value))
        expected = "a list of argument indices (integers)"
    else:
        return value
    if wrong:
        raise TraceFormatError(source, line_number,
                               f"{record.get('INSTRUCTION')} field {key!r} must be {expected}, got {value!r}")
    return value


#: The largest TIME or MEMORY a trace holds: traces are stored as 64-bit integers (the parsed-trace
#: cache, the compiled core); a larger one is no real measurement.
_LARGEST = 2 ** 63 - 1


def _integer(value, what: str, source: str, line_number: int, minimum: int | None = None) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's 1e400 is an infinite float
        raise TraceFormatError(source, line_number, f"{what} is not an integer: {value!r}") from None
    if minimum is not None and number < minimum:
        raise TraceFormatError(source, line_number, f"{what} must be >= {minimum}, got {number}")
    if number > _LARGEST:
        raise TraceFormatError(source, line_number, f"{what} must be < 2**63 (a 64-bit integer), got {number}")
    return number


#: What reading a damaged file raises: a cut gzip stream (EOFError), bad compressed
#: data (zlib.error, gzip.BadGzipFile, zipfile.BadZipFile), bytes that are not UTF-8.
_UNREADABLE = (EOFError, OSError, zlib.error, zipfile.BadZipFile, UnicodeDecodeError)


def _numbered_lines(lines: Iterable[str | bytes], source: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of text or UTF-8 byte lines; a file that cannot be read on is an
    error at the line where it stopped."""
    iterator = iter(lines)
    line_number = 0
    while True:
        line_number += 1
        try:
            line = next(iterator)
            if isinstance(line, bytes):
                line = line.decode("utf-8")
        except StopIteration:
            return
        except _UNREADABLE as exc:
            raise TraceFormatError(source, line_number, f"cannot be read ({_reason(exc)})") from None
        yield line_number, line


def _reason(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "the compressed stream ends early: a cut or partly copied file?"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text: {exc.reason} at byte {exc.start + 1} of the line"
    return " ".join(str(exc).split()) or type(exc).__name__


def _read_records(lines: Iterable[str | bytes], source: str) -> list[tuple[int, dict]]:
    """``(line number, record)`` of every non-blank line, each checked to be a known instruction."""
    records: list[tuple[int, dict]] = []
    for line_number, line in _numbered_lines(lines, source):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(source, line_number, f"malformed JSON ({exc.msg})") from None
        if not isinstance(record, dict) or "INSTRUCTION" not in record:
            raise TraceFormatError(source, line_number, "a log line must be a JSON object with an INSTRUCTION")
        if record["INSTRUCTION"] not in _KNOWN:
            raise TraceFormatError(
                source, line_number,
                f"unknown instruction {record['INSTRUCTION']!r} (known: {', '.join(sorted(_KNOWN))})",
            )
        records.append((line_number, record))
    return records


def _read_records_at_once(data: bytes) -> list[tuple[int, dict]] | None:
    """:func:`_read_records` of a whole file's bytes with one JSON decode of all its lines (the log's
    18,000-200,000 separate decodes were a third of a cold run's parse), or None when any line is not
    a known instruction's JSON object: then the line-by-line reader names the line."""
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return None
    if lines[-1] == "":  # the file's last newline ends a line; it does not start one
        lines.pop()
    numbered = None  # line i is record i (every log we have)
    decoded = _decode_all(lines)
    if decoded is None:  # blank lines (which the one decode rejects) or a malformed line
        numbered = [(number, line) for number, line in enumerate(map(str.strip, lines), 1) if line]
        lines = [line for _, line in numbered]
        decoded = _decode_all(lines)
        if decoded is None:
            return None
    for record in decoded:
        if type(record) is not dict or record.get("INSTRUCTION") not in _KNOWN:
            return None
    if numbered is None:
        return list(enumerate(decoded, 1))
    return [(number, record) for (number, _), record in zip(numbered, decoded)]


def _decode_all(lines: list[str]) -> list | None:
    """The JSON value of each line, or None when a line is not exactly one value."""
    try:
        decoded = json.loads("[" + ",".join(lines) + "]")
    except (json.JSONDecodeError, RecursionError):
        return None
    return decoded if len(decoded) == len(lines) else None  # "{...},{...}" on one line is two values


def parse_lines(lines: Iterable[str | bytes], source: str = "<log>", name: str | None = None,
                start: bool = True, records: list[tuple[int, dict]] | None = None) -> Trace:
    """Build a :class:`Trace` from the lines of a simrd log (text, or UTF-8 bytes).

    With ``start=True`` everything before ``ANNOTATE START`` is skipped, as the DTR
    artifact's evaluation does for its logs. ``records``: the lines already read (by
    :func:`_read_records_at_once`); ``lines`` is then not read.
    """
    if records is None:
        records = _read_records(lines, source)
    read = _Records(records, source, _start_position(records, source) if start else 0)
    build = _Builder(source)
    while read.position < len(records):
        line_number, record = records[read.position]
        read.position += 1
        instruction = record["INSTRUCTION"]
        step = _INSTRUCTIONS.get(instruction)
        if step is None:  # MEMORY or ALIAS outside of the CONSTANT/CALL they belong to
            raise build.error(line_number, f"{instruction} line does not follow a CONSTANT or CALL")
        step(build, read, line_number, record)

    # Outputs: every name still holding a reference is rematerialized and pinned, in
    # the order the names were first defined (a dict keeps simrd's order).
    for tensor in build.names.values():
        if build.tensor_refs[tensor] > 0:
            build.schedule.append((PIN, tensor))

    return Trace(
        name=name or source,
        operators=tuple(build.operators),
        tensor_names=tuple(build.tensor_names),
        tensor_op=tuple(build.tensor_op),
        tensor_index=tuple(build.tensor_index),
        schedule=tuple(build.schedule),
        source=source,
    )


def _start_position(records: list[tuple[int, dict]], source: str) -> int:
    """The index of the record after ``ANNOTATE START``."""
    position = 0
    while position < len(records) and not (
        records[position][1]["INSTRUCTION"] == "ANNOTATE" and records[position][1].get("ANNOTATION") == "START"
    ):
        position += 1
    if position == len(records):
        raise TraceFormatError(source, None, "no ANNOTATE START in the log (load it with start=False)")
    return position + 1


class _Records:
    """The log's records from ``position`` on, and their fields read with the checks that name the line."""

    def __init__(self, records: list[tuple[int, dict]], source: str, position: int):
        self.records = records
        self.source = source
        self.position = position

    def take(self, expected: str, result_name: str, after: int) -> tuple[int, dict]:
        """The next record, which must be ``expected`` (MEMORY or ALIAS) for ``result_name``."""
        if self.position >= len(self.records):
            raise TraceFormatError(self.source, after,
                                   f"log ends where a {expected} line for {result_name!r} should follow")
        line_number, record = self.records[self.position]
        self.position += 1
        if record["INSTRUCTION"] != expected or record.get("NAME") != result_name:
            raise TraceFormatError(self.source, line_number,
                                   f"expected {expected} for {result_name!r}, found {record['INSTRUCTION']}")
        return line_number, record

    def number(self, record: dict, key: str, line_number: int, minimum: int | None = None) -> int:
        """``record[key]`` as an integer; a plain in-range int (every real log's) skips the checks."""
        value = record.get(key)
        if type(value) is int and (minimum is None or value >= minimum) and value <= _LARGEST:
            return value
        return _integer(_field(record, key, self.source, line_number), key, self.source, line_number, minimum)

    def tensor_names(self, record: dict, key: str, line_number: int) -> list[str]:
        value = record.get(key)
        if type(value) is list and all(map(_is_str, value)):
            return value
        return _field(record, key, self.source, line_number)  # raises, naming the field

    def tensor_name(self, record: dict, key: str, line_number: int) -> str:
        value = record.get(key)
        return value if type(value) is str else _field(record, key, self.source, line_number)


def _read_call(build: _Builder, read: _Records, line_number: int, record: dict) -> None:
    op_name = read.tensor_name(record, "NAME", line_number)
    results = read.tensor_names(record, "RESULT", line_number)
    arg_names = read.tensor_names(record, "ARGS", line_number)
    build.in_backward |= "backward" in op_name
    sizes, aliases = [], []
    for result_name in results:
        memory_line, memory = read.take("MEMORY", result_name, line_number)
        alias_line, alias = read.take("ALIAS", result_name, line_number)
        alias_index = read.number(alias, "ALIAS", alias_line)
        size = read.number(memory, "MEMORY", memory_line, 0)
        sizes.append(0 if alias_index != -1 else size)
        aliases.append(alias_index)
    args = [build.lookup(arg, line_number) for arg in arg_names]
    for alias_index in aliases:
        if not -1 <= alias_index < len(args):
            raise build.error(line_number, f"ALIAS index {alias_index} out of range for {len(args)} arguments")
    for result_name in results:
        if result_name in build.names:
            raise build.error(line_number, f"CALL result {result_name!r} is already defined")
    cost = read.number(record, "TIME", line_number, 0)
    outputs = build.add_operator(op_name, cost, args, sizes, aliases, results, line_number)
    build.names.update(zip(results, outputs))


def _read_release(build: _Builder, read: _Records, line_number: int, record: dict) -> None:
    tensor = build.names.get(read.tensor_name(record, "NAME", line_number))
    if tensor is not None:
        build.tensor_refs[tensor] -= 1
        build.schedule.append((RELEASE, tensor))


def _read_copy(build: _Builder, read: _Records, line_number: int, record: dict) -> None:
    destination, src = read.tensor_name(record, "DST", line_number), read.tensor_name(record, "SRC", line_number)
    if destination in build.names:
        raise build.error(line_number, f"COPY to already defined tensor {destination!r}")
    tensor = build.lookup(src, line_number)
    build.names[destination] = tensor
    build.tensor_refs[tensor] += 1
    build.schedule.append((GET, tensor))


def _read_constant(build: _Builder, read: _Records, line_number: int, record: dict) -> None:
    name = read.tensor_name(record, "NAME", line_number)
    memory_line, memory = read.take("MEMORY", name, line_number)
    size = read.number(memory, "MEMORY", memory_line, 0)
    (tensor,) = build.add_operator(CONSTANT_OP, 0, (), (size,), (-1,), (name,), line_number)
    build.schedule.append((PIN, tensor))
    build.names[name] = tensor


def _read_mutate(build: _Builder, read: _Records, line_number: int, record: dict) -> None:
    op_name = read.tensor_name(record, "NAME", line_number)
    arg_names = read.tensor_names(record, "ARGS", line_number)
    mutated = _field(record, "MUTATE", read.source, line_number)
    build.in_backward |= "backward" in op_name
    args = [build.lookup(arg, line_number) for arg in arg_names]
    for index in mutated:
        if not 0 <= index < len(args):
            raise build.error(line_number, f"MUTATE index {index} out of range for {len(args)} arguments")
    sizes = [build.storage_size(args[index]) for index in mutated]
    new_names = [build.tensor_names[args[index]] + "$" for index in mutated]
    cost = read.number(record, "TIME", line_number, 0)
    outputs = build.add_operator(op_name, cost, args, sizes, [-1] * len(mutated), new_names, line_number)
    for index, new_tensor in zip(mutated, outputs):
        old_tensor = build.names[arg_names[index]]
        build.names[arg_names[index]] = new_tensor
        build.tensor_refs[old_tensor] -= 1
        build.schedule.append((RELEASE, old_tensor))


def _read_annotate(build: _Builder, read: _Records, line_number: int, record: dict) -> None:
    if record.get("ANNOTATION") == "BACKWARD":
        build.in_backward = True


def _read_copy_from(build: _Builder, read: _Records, line_number: int, record: dict) -> None:
    destination, src = read.tensor_name(record, "DST", line_number), read.tensor_name(record, "SRC", line_number)
    old_tensor = build.lookup(destination, line_number)
    tensor = build.lookup(src, line_number)
    build.names[destination] = tensor
    build.tensor_refs[old_tensor] -= 1
    build.tensor_refs[tensor] += 1
    build.schedule.append((RELEASE, old_tensor))
    build.schedule.append((GET, tensor))


#: What each instruction does to the trace being built (MEMORY and ALIAS are read by CALL and CONSTANT).
_INSTRUCTIONS = {"CALL": _read_call, "RELEASE": _read_release, "COPY": _read_copy, "CONSTANT": _read_constant,
                 "MUTATE": _read_mutate, "ANNOTATE": _read_annotate, "COPY_FROM": _read_copy_from}


def trace_name(path: str | os.PathLike) -> str:
    """Short name of a log file: the file name without ``.log``/``.jsonl``/``.gz``."""
    name = Path(path).name
    for suffix in (".gz", ".log", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def load_log(path: str | os.PathLike, start: bool = True, cache: bool | str | os.PathLike = True) -> Trace:
    """Load one simrd log (``.log``, ``.jsonl`` or gzip-compressed ``.gz``).

    A plain log that the compiled reader takes (every real log we have) is read by it, as fast as a
    cached copy would load, so none is kept. Any other log (gzip-compressed, or one the compiled reader
    leaves to :func:`parse_lines`) is parsed in Python and cached (:mod:`dtrlab.trace.cache`) under
    ``cache``: True for the default directory (``$DTRLAB_CACHE`` or ``~/.cache/dtrlab``), a directory,
    or False to parse without caching. The key is the file's content hash and the parser version, so
    an edited log or a new parser is parsed again.
    """
    from . import cache as trace_cache

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no log file at {path}")
    data = path.read_bytes()
    name, source = trace_name(path), str(path)
    if _read_compiled is not None and path.suffix != ".gz":
        with _cyclic_gc_paused():
            flat = _read_compiled(data, start)
            if flat is not None:
                return trace_cache.trace_from_flat(flat, flat["operators"], flat["tensors"], name, source)
    if cache is False:
        return _parse_bytes(data, path, name, start)
    digest = trace_cache.file_digest(data)
    cached_at = trace_cache.cache_path(trace_cache.default_cache_dir() if cache is True else cache, digest, start)
    trace = trace_cache.load_cached(cached_at, digest, start, name, source)
    if trace is None:
        trace = _parse_bytes(data, path, name, start)
        trace_cache.store(cached_at, trace, digest, start)
    return trace


def _parse_bytes(data: bytes, path: Path, name: str, start: bool) -> Trace:
    """Parse a log file's bytes read once (so the cache key is the content parsed)."""
    with _cyclic_gc_paused():
        records = None
        if path.suffix != ".gz":
            records = _read_records_at_once(data)
        raw = gzip.GzipFile(fileobj=io.BytesIO(data)) if path.suffix == ".gz" else io.BytesIO(data)
        with raw:  # otherwise byte lines, decoded one at a time so that an error names its line
            return parse_lines(raw, source=str(path), name=name, start=start, records=records)


@contextmanager
def _cyclic_gc_paused():
    """A parse allocates 10^5-10^6 dicts, lists and tuples that form no cycles; the cyclic collector's
    passes over them freed nothing and took a quarter to a third of a large log's parse."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_manifest(data: bytes, where: str) -> dict[str, dict]:
    """The entries of a manifest.json (``{"models": [{"log": ..., "has_start": ...}, ...]}``), by log file name."""
    try:
        manifest = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        raise TraceFormatError(where, line, f"not valid JSON ({getattr(exc, 'msg', None) or exc.reason})") from None
    models = manifest.get("models") if isinstance(manifest, dict) else None
    if not isinstance(models, list):
        raise TraceFormatError(where, None, "manifest.json must have a 'models' list")
    entries = {}
    for number, entry in enumerate(models, start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("log"), str):
            label = f" ({entry['name']!r})" if isinstance(entry, dict) and "name" in entry else ""
            raise TraceFormatError(where, None, f"model {number}{label} has no \"log\" file name")
        entries[Path(entry["log"]).name] = entry
    return entries


def load_directory(directory: str | os.PathLike) -> dict[str, Trace]:
    """Load every log of a directory, keyed by trace name.

    With a ``manifest.json`` (the DTR artifact's shape) its models are loaded in its
    order, resolving each ``log`` path by file name inside ``directory`` and using
    its ``has_start`` flag; otherwise every ``*.log``/``*.jsonl``/``*.jsonl.gz`` file.
    """
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if manifest_path.is_file():
        traces = {}
        for file_name, entry in _read_manifest(manifest_path.read_bytes(), str(manifest_path)).items():
            log_path = directory / file_name
            if not log_path.is_file():
                raise FileNotFoundError(f"{manifest_path} lists {entry['log']!r}, but there is no {log_path}")
            trace = load_log(log_path, start=entry.get("has_start", True))
            trace.meta.update({"manifest_name": entry.get("name"), "title": entry.get("title")})
            traces[trace.name] = trace
        return traces
    paths = sorted(p for p in directory.iterdir() if p.name.endswith((".log", ".jsonl", ".jsonl.gz")))
    if not paths:
        raise FileNotFoundError(f"no manifest.json and no .log/.jsonl files in {directory}")
    return {trace_name(p): load_log(p) for p in paths}


def load_zip(path: str | os.PathLike) -> dict[str, Trace]:
    """Load the logs inside a zip archive such as the DTR artifact's ``logs.zip``."""
    traces = {}
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise TraceFormatError(str(path), None, "not a zip archive (or a damaged one)") from None
    with archive:
        members = {Path(m).name: m for m in archive.namelist() if not m.endswith("/")}
        entries = {}
        if "manifest.json" in members:
            where = f"{path}!{members['manifest.json']}"
            entries = _read_manifest(_read_member(archive, members["manifest.json"], where), where)
        for file_name, member in sorted(members.items()):
            if not file_name.endswith((".log", ".jsonl")):
                continue
            with archive.open(member) as raw:
                trace = parse_lines(raw, source=f"{path}!{member}", name=trace_name(file_name),
                                    start=entries.get(file_name, {}).get("has_start", True))
            traces[trace.name] = trace
    if not traces:
        raise TraceFormatError(str(path), None, "the zip holds no .log or .jsonl file")
    return traces


def _read_member(archive: zipfile.ZipFile, member: str, where: str) -> bytes:
    try:
        return archive.read(member)
    except _UNREADABLE as exc:
        raise TraceFormatError(where, None, f"cannot be read ({_reason(exc)})") from None


def load(path: str | os.PathLike) -> Trace | dict[str, Trace]:
    """Load a log file, a directory of logs, or a zip of logs."""
    path = Path(path)
    if path.is_dir():
        return load_directory(path)
    if path.suffix == ".zip":
        return load_zip(path)
    return load_log(path)
