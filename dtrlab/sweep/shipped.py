"""The shipped results: a read-only lower layer under the sweep cache.

The notebooks' sweeps on the shipped traces (and the DTR logs' census) are committed
as ``results/shipped/<trace set>/<trace name>.parquet``, so a fresh clone opens
every notebook in seconds. One file per trace; each row is one row of the sweep
cache (the columns :class:`~dtrlab.sweep.SweepCache` stores) plus its
``trace_hash`` and ``config_key`` (the cache directory's name, which hashes the
policy, overhead limit and intervention). The file's parquet metadata
(key ``dtrlab``) holds the trace name and content hash, the simulator version and
every configuration's full key and row columns. Analysis tables that are not sweep rows (notebook
03's intervention search, :mod:`dtrlab.sweep.tables`) are shipped as they were
cached, in ``results/shipped/<trace set>/tables/``.

Checked, not trusted: the bundle's ``MANIFEST.json`` lists every file's sha256 and
size (:func:`dtrlab.integrity.write_manifest`, written by ``dtrlab ship results``
and ``dtrlab ship search``). A file is read only if it matches its entry
(hashed once per process per (path, size, mtime)); an edited, truncated or unlisted
file is ignored with a one-line warning and its rows are simulated, and a bundle
without a valid manifest is not used at all. A row of a matching file is used only
if its simulator version is the running one and its trace hash and config key are
those asked for; anything else is recomputed. ``tests/test_shipped.py`` checks the
manifest and recomputes a sample of the rows (a slow test all of them).
``DTRLAB_RECOMPUTE=1`` ignores the layer; ``DTRLAB_SHIPPED=DIR`` reads the bundle in
DIR instead. ``dtrlab ship results`` regenerates it.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..integrity import (MANIFEST_NAME, IntegrityError, atomic_write_bytes, read_hashed, read_manifest,
                         verify_in_manifest)
from ..runtime import SIMULATOR_VERSION

SHIPPED_ENV = "DTRLAB_SHIPPED"
RECOMPUTE_ENV = "DTRLAB_RECOMPUTE"
#: The bundle of a source checkout (absent from an installed wheel: then there is no shipped layer).
DEFAULT_SHIPPED_DIR = Path(__file__).resolve().parents[2] / "results" / "shipped"
METADATA_KEY = b"dtrlab"
#: Columns a bundle adds to the cache's own.
INDEX_COLUMNS = ["trace_hash", "config_key"]


def recompute_requested() -> bool:
    """True when ``$DTRLAB_RECOMPUTE`` is set to anything but empty, 0, false or no."""
    return os.environ.get(RECOMPUTE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def shipped_dir() -> Path | None:
    """The bundle in use, or None (``DTRLAB_RECOMPUTE`` set, or no bundle)."""
    if recompute_requested():
        return None
    directory = Path(os.environ.get(SHIPPED_ENV) or DEFAULT_SHIPPED_DIR)
    return directory if directory.is_dir() else None


def shipped_rows(trace_hash: str, config_key: str) -> pd.DataFrame:
    """The valid shipped rows of one trace and configuration (cache columns; empty frame if none)."""
    directory = shipped_dir()
    if directory is None:
        return pd.DataFrame()
    files = sorted(directory.glob("*/*.parquet"))  # <trace set>/<trace>.parquet (tables/ lie one level deeper)
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in [directory / MANIFEST_NAME, *files]
                  if f.exists())
    found = pd.DataFrame()
    for entry in _index(str(directory), stamp).get(trace_hash, ()):  # a later file's rows win, as in file order
        found = _rows(*entry).get((trace_hash, config_key), found)
    return found.copy()


@functools.lru_cache(maxsize=2)
def _index(directory: str, stamp: tuple) -> dict[str, list[tuple]]:
    """The verified bundle files by the trace hash in their metadata (only their schemas read: a census
    reads the rows of its own traces' files alone); rebuilt when a file changes."""
    try:
        read_manifest(directory)
    except (OSError, IntegrityError) as exc:
        warnings.warn(f"ignoring the shipped results in {directory}: no valid {MANIFEST_NAME} ({exc}); "
                      "every run is simulated", stacklevel=4)
        return {}
    index = {}
    for entry in stamp:
        path = entry[0]
        if Path(path).name == MANIFEST_NAME or not verified(path, directory):
            continue
        trace_hash = json.loads((pq.read_schema(path).metadata or {}).get(METADATA_KEY, b"{}")).get("trace_hash")
        if trace_hash is None:
            _read_valid(Path(path))  # not a shipped-results file: it says so
        else:
            index.setdefault(trace_hash, []).append(entry)
    return index


@functools.lru_cache(maxsize=32)
def _rows(path: str, mtime_ns: int, size: int) -> dict[tuple[str, str], pd.DataFrame]:
    """Every valid row of one verified bundle file by (trace hash, config key); ``mtime_ns`` and ``size`` key the
    cache, so a changed file is read again."""
    rows, configs = _read_valid(Path(path))
    index = {}
    for key, group in rows.groupby(INDEX_COLUMNS, sort=False):
        # Only the columns this configuration's cached rows had: a file holds configurations with
        # and without the memory metrics of non-flat models, null where absent.
        columns = configs.get(key[1], {}).get("row_columns")
        if columns:
            index[key] = group[columns].reset_index(drop=True)
    return index


def verified(path: str | os.PathLike, directory: str | os.PathLike) -> bool:
    """True when the shipped file ``path`` matches the bundle's manifest; else a one-line warning and False."""
    try:
        verify_in_manifest(path, directory)
        return True
    except IntegrityError as exc:
        warnings.warn(f"ignoring a shipped file: {exc}; its results are recomputed", stacklevel=4)
    except OSError as exc:
        warnings.warn(f"ignoring the shipped file {path} ({exc}); its results are recomputed", stacklevel=4)
    return False


def _read_valid(path: Path) -> tuple[pd.DataFrame, dict]:
    """The rows of one bundle file that this simulator may reuse, and its configurations."""
    table = pq.read_table(path)
    metadata = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    frame = table.to_pandas()
    missing = [c for c in INDEX_COLUMNS + ["simulator_version", "budget_bytes"] if c not in frame]
    if missing or "trace_hash" not in metadata:
        warnings.warn(f"ignoring {path}: not a shipped-results file (missing {missing or 'metadata'}); "
                      "regenerate the bundle with dtrlab ship results", stacklevel=4)
        return pd.DataFrame(columns=INDEX_COLUMNS), {}
    valid = (frame["simulator_version"] == SIMULATOR_VERSION) & (frame["trace_hash"] == metadata["trace_hash"])
    return frame[valid], metadata.get("configs", {})


def tables_from_cache(cache_root: str | os.PathLike, trace_hash: str) -> list[Path]:
    """The verified cached analysis tables (:mod:`dtrlab.sweep.tables`) of one trace under this simulator
    (a damaged one is skipped with a warning)."""
    tables = Path(cache_root) / f"sim-v{SIMULATOR_VERSION}" / trace_hash[:24] / "tables"
    valid = []
    for path in sorted(tables.glob("*.parquet")):
        try:
            schema = pq.read_schema(pa.BufferReader(read_hashed(path)))
        except Exception as exc:  # noqa: BLE001  (damaged: not shipped)
            warnings.warn(f"skipping the cached table {path}: {str(exc).splitlines()[0][:200]}", stacklevel=2)
            continue
        metadata = json.loads((schema.metadata or {}).get(METADATA_KEY, b"{}"))
        if metadata.get("trace_hash") == trace_hash and metadata.get("simulator_version") == SIMULATOR_VERSION:
            valid.append(path)
    return valid


def bundle_table(rows: pd.DataFrame, *, trace: str, trace_hash: str, configs: dict[str, dict]) -> pa.Table:
    """One trace's bundle file: ``rows`` (cache columns + :data:`INDEX_COLUMNS`) with its metadata."""
    from ..version import __version__

    metadata = {"format": 1, "trace": trace, "trace_hash": trace_hash, "simulator_version": SIMULATOR_VERSION,
                "dtrlab_version": __version__, "configs": configs}
    rows = rows.sort_values(["config_key", "budget_bytes"], kind="stable").reset_index(drop=True)
    table = pa.Table.from_pandas(rows, preserve_index=False)
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata, sort_keys=True).encode()})


def write_bundle_file(table: pa.Table, path: Path) -> None:
    """Write one bundle file atomically (then record it: :func:`dtrlab.integrity.write_manifest`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", compression_level=19)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def read_metadata(path: str | os.PathLike) -> dict:
    """The ``dtrlab`` metadata of a bundle file (trace, trace_hash, simulator_version, configs, ...)."""
    return json.loads(pq.read_schema(path).metadata[METADATA_KEY])
