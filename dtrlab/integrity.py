"""Integrity primitives shared by every cache and shipped file (imports nothing from dtrlab).

* :func:`atomic_write_bytes` / :func:`atomic_write_json`: write under a temporary
  name in the same directory, flush, fsync, rename over the target, fsync the
  directory. On any failure the temporary file is removed and the error (an
  ``OSError`` such as ``ENOSPC`` or ``PermissionError``) propagates, so a reader
  sees the old file or the whole new one, never a 0-byte or half file.
* :func:`sha256_bytes`, :func:`sha256_file`: hex digests.
* :func:`read_json`: a JSON file, or :class:`IntegrityError` when it is not whole (a 0-byte or cut file).
* :func:`write_hashed` / :func:`read_hashed`: content-addressed files whose name
  carries the sha256 of their bytes (``part-<sha256>.parquet``); a read verifies it.
* :func:`write_manifest` / :func:`verify_in_manifest`: a directory's ``MANIFEST.json``
  of each file's sha256 and size (the shipped results); a verification is cached by
  (path, size, mtime), so a process hashes each file once.
* :func:`quarantine`: rename a damaged file aside (``<name>.damaged``), with a one-line warning.
* :func:`remove_stale`: remove what a killed writer or a quarantine left behind (``.<name>.<hex>.tmp``,
  ``<name>.damaged``) once it is older than :data:`STALE_AGE_S`, with one message giving the count.

Everything that fails verification raises :class:`IntegrityError`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

#: The manifest file of a directory of shipped files.
MANIFEST_NAME = "MANIFEST.json"
MANIFEST_FORMAT = "dtrlab-manifest-1"
_HEX = frozenset("0123456789abcdef")


class IntegrityError(ValueError):
    """A file that is damaged: unreadable, or not matching its recorded checksum or size."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # a platform without directory handles (Windows): the rename is all there is
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically and durably; raises ``OSError`` (nothing left behind) on failure."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.urandom(16).hex()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    _fsync_directory(path.parent)


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as indented, key-sorted JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: str | os.PathLike):
    """The JSON document in ``path``; a file that is not whole, valid UTF-8 JSON raises :class:`IntegrityError`
    (a missing one ``FileNotFoundError``)."""
    try:
        return json.loads(Path(path).read_bytes())
    except (UnicodeDecodeError, ValueError) as exc:
        raise IntegrityError(f"{path}: not valid JSON ({exc})") from None


def write_hashed(directory: str | os.PathLike, prefix: str, suffix: str, data: bytes) -> Path:
    """Write ``data`` atomically as ``directory/{prefix}-{sha256 of data}{suffix}``; returns the path."""
    path = Path(directory) / f"{prefix}-{sha256_bytes(data)}{suffix}"
    atomic_write_bytes(path, data)
    return path


def read_hashed(path: str | os.PathLike) -> bytes:
    """The bytes of a file written by :func:`write_hashed`, verified against the sha256 in its name.

    Raises :class:`IntegrityError` when they differ (or the name holds no sha256: e.g. a file of an
    older format), ``FileNotFoundError`` when it is gone.
    """
    path = Path(path)
    expected = path.name.split(".")[0].rpartition("-")[2]
    if len(expected) != 64 or not set(expected) <= _HEX:
        raise IntegrityError(f"{path}: no sha256 in its name (an older format?)")
    data = path.read_bytes()
    if sha256_bytes(data) != expected:
        raise IntegrityError(f"{path}: its {len(data)} bytes do not match the sha256 in its name")
    return data


def quarantine(path: str | os.PathLike, reason: str, stacklevel: int = 2) -> None:
    """Move a damaged file aside (``<name>.damaged``, else delete it) with a one-line warning; never raises."""
    path = Path(path)
    aside = path.with_name(path.name + ".damaged")
    try:
        os.replace(path, aside)
        where = f"moved to {aside.name}"
    except FileNotFoundError:
        return  # another process got there first
    except OSError:
        try:
            path.unlink()
            where = "deleted"
        except OSError:
            where = "left in place (unwritable), ignored"
    reason = reason.removeprefix(f"{path}: ")
    warnings.warn(f"ignoring damaged cache file {path} ({reason}); {where}, recomputing", stacklevel=stacklevel + 1)


#: How old a leftover must be before :func:`remove_stale` removes it. A write takes seconds, so a
#: temporary file an hour old has no live writer (its process was killed mid-write); a file moved
#: aside as damaged was never read again, and the run that moved it aside computed its entry anew.
STALE_AGE_S = 3600.0
_DAMAGED = ".damaged"


def is_unfinished_write(name: str) -> bool:
    """``name`` is a temporary file of :func:`atomic_write_bytes` (``.<name>.<32 hex digits>.tmp``)."""
    stem, dot, token = name.removesuffix(".tmp").rpartition(".")
    return name.startswith(".") and name.endswith(".tmp") and bool(stem) and bool(dot) \
        and len(token) == 32 and set(token) <= _HEX


@dataclass(frozen=True)
class StaleFiles:
    """What :func:`remove_stale` removed: unfinished atomic writes and quarantined damaged files."""

    directory: Path
    min_age_s: float
    unfinished: int = 0
    damaged: int = 0

    @property
    def removed(self) -> int:
        return self.unfinished + self.damaged

    def message(self) -> str:
        def count(n: int, what: str) -> str:
            return f"{n} {what}" + ("" if n == 1 else "s")

        return (f"removed {count(self.removed, 'stale file')} from {self.directory} "
                f"({count(self.unfinished, 'unfinished write')}, "
                f"{count(self.damaged, 'damaged file')} set aside), each older than {self.min_age_s / 3600:g} h")


def remove_stale(directory: str | os.PathLike, *, recursive: bool = False, min_age_s: float = STALE_AGE_S,
                 announce: bool = True) -> StaleFiles:
    """Remove unfinished atomic writes and quarantined damaged files (``*.damaged``) older than
    ``min_age_s`` from ``directory`` (and its subdirectories with ``recursive``); with ``announce``,
    one warning giving the count when any was removed. A file that vanishes or cannot be removed
    is left alone; a missing directory has nothing stale."""
    directory = Path(directory)
    cutoff = time.time() - min_age_s
    unfinished = damaged = 0
    for folder, _, names in os.walk(directory) if recursive else [(directory, None, _names(directory))]:
        for name in names:
            is_damaged = name.endswith(_DAMAGED)
            if not (is_damaged or is_unfinished_write(name)):
                continue
            path = Path(folder) / name
            try:
                info = path.lstat()
                if info.st_mtime > cutoff or not stat.S_ISREG(info.st_mode):
                    continue
                path.unlink()
            except OSError:
                continue
            damaged += is_damaged
            unfinished += not is_damaged
    stale = StaleFiles(directory, min_age_s, unfinished, damaged)
    if announce and stale.removed:
        warnings.warn(stale.message(), stacklevel=2)
    return stale


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:  # missing, or not a directory
        return []


# ------------------------------------------------------------------ manifests of shipped files
def _manifest_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_NAME
                  and not p.name.startswith("."))


def write_manifest(directory: str | os.PathLike, paths=None) -> dict:
    """Record the sha256 and size of files under ``directory`` in ``directory/MANIFEST.json``.

    ``paths=None`` records every file (hidden ones and the manifest aside). Otherwise only
    ``paths`` are (re)hashed; the other entries of a valid existing manifest are kept,
    entries of files that no longer exist dropped. Returns the manifest.
    """
    directory = Path(directory)
    entries = {}
    if paths is not None:
        try:
            entries = read_manifest(directory)
        except (FileNotFoundError, IntegrityError):
            entries = {}
    for path in _manifest_files(directory) if paths is None else [Path(p) for p in paths]:
        relative = path.resolve().relative_to(directory.resolve()).as_posix()
        entries[relative] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    entries = {name: entry for name, entry in sorted(entries.items()) if (directory / name).is_file()}
    manifest = {"format": MANIFEST_FORMAT, "files": entries}
    atomic_write_json(directory / MANIFEST_NAME, manifest)
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict[str, dict]:
    """``{relative path: {"sha256", "size"}}`` of ``directory/MANIFEST.json``.

    Raises ``FileNotFoundError`` when there is none and :class:`IntegrityError` when it is damaged.
    """
    path = Path(directory) / MANIFEST_NAME
    document = read_json(path)
    if not isinstance(document, dict):
        raise IntegrityError(f"{path} is not a dtrlab manifest")
    files = document.get("files")
    if document.get("format") != MANIFEST_FORMAT or not isinstance(files, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int)
            for e in files.values()):
        raise IntegrityError(f"{path} is not a dtrlab manifest")
    return files


def verify_in_manifest(path: str | os.PathLike, directory: str | os.PathLike) -> None:
    """Check ``path`` (a file under ``directory``) against ``directory/MANIFEST.json``.

    Raises :class:`IntegrityError` naming the reason (not listed, other size, other sha256,
    damaged manifest) and ``FileNotFoundError`` when the manifest is missing. The file's
    hash is cached by (path, size, mtime), so checking an unchanged file again is cheap.
    """
    path, directory = Path(path), Path(directory)
    manifest = directory / MANIFEST_NAME
    stat = manifest.stat()
    entries = _cached_manifest(str(manifest), stat.st_size, stat.st_mtime_ns)
    relative = path.resolve().relative_to(directory.resolve()).as_posix()
    entry = entries.get(relative)
    if entry is None:
        raise IntegrityError(f"{relative} is not listed in {manifest}")
    stat = path.stat()
    if stat.st_size != entry["size"]:
        raise IntegrityError(f"{relative} has {stat.st_size} bytes where {manifest} says {entry['size']}")
    if _cached_sha256(str(path), stat.st_size, stat.st_mtime_ns) != entry["sha256"]:
        raise IntegrityError(f"{relative} does not match its sha256 in {manifest}")


@functools.lru_cache(maxsize=8)
def _cached_manifest(path: str, size: int, mtime_ns: int) -> dict[str, dict]:
    return read_manifest(Path(path).parent)


@functools.lru_cache(maxsize=4096)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)
