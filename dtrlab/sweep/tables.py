"""Cached result tables of analyses that are not sweeps (e.g. an intervention search).

A :class:`TableCache` stores one DataFrame per (trace, kind, configuration) next to
the sweep cache, ``ROOT/sim-v{SIMULATOR_VERSION}/{trace hash}/tables/{kind}-{key}-{sha256}.parquet``
(content-addressed like the sweep cache's parts: verified on read, a damaged file is
moved aside and recomputed; a cache that cannot be written only warns), with the trace
hash, simulator version and full key in the parquet metadata. Like sweep rows, a table
is also looked up in the read-only shipped bundle (``results/shipped/<trace set>/tables/``,
:mod:`dtrlab.sweep.shipped`: only if it matches the bundle's manifest) and used only
if its simulator version, trace hash and key all match.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..integrity import remove_stale, write_hashed
from ..runtime import SIMULATOR_VERSION
from ..trace.model import Trace
from .cache import read_part
from .shipped import METADATA_KEY, shipped_dir, verified


class TableCache:
    """One cached table: ``kind`` names the analysis, ``config`` (JSON-able) what its result depends on."""

    def __init__(self, root: str | os.PathLike, trace: Trace, kind: str, config: dict):
        self.key = {"simulator_version": SIMULATOR_VERSION, "trace": trace.name, "trace_hash": trace.content_hash,
                    "kind": kind, "config": config}
        digest = hashlib.sha256(json.dumps({"kind": kind, "config": config}, sort_keys=True, default=repr).encode())
        self.stem = f"{kind}-{digest.hexdigest()[:24]}"
        self.directory = Path(root) / f"sim-v{SIMULATOR_VERSION}" / trace.content_hash[:24] / "tables"

    def load(self) -> pd.DataFrame | None:
        """The cached table (the writable cache's, else the shipped one), or None."""
        remove_stale(self.directory)
        for path in sorted(self.directory.glob(f"{self.stem}-*.parquet")):
            try:
                table = read_part(path)  # verified against the sha256 in its name
            except FileNotFoundError:
                continue
            if table is not None and self._valid(pq.read_schema(path)):
                return table
        bundle = shipped_dir()
        if bundle is not None:  # shipped tables (named without their sha256) only if they match the manifest
            for path in sorted(bundle.glob(f"*/tables/{self.stem}*.parquet")):
                if verified(path, bundle) and self._valid(pq.read_schema(path)):
                    return pd.read_parquet(path)
        return None

    def _valid(self, schema) -> bool:
        metadata = json.loads((schema.metadata or {}).get(METADATA_KEY, b"{}"))
        return all(metadata.get(k) == self.key[k] for k in ("simulator_version", "trace_hash", "kind")) and \
            json.dumps(metadata.get("config"), sort_keys=True, default=repr) == \
            json.dumps(self.key["config"], sort_keys=True, default=repr)

    def store(self, table: pd.DataFrame) -> None:
        arrow = pa.Table.from_pandas(table, preserve_index=False)
        metadata = {**(arrow.schema.metadata or {}), METADATA_KEY: json.dumps(self.key, sort_keys=True,
                                                                             default=repr).encode()}
        sink = pa.BufferOutputStream()
        pq.write_table(arrow.replace_schema_metadata(metadata), sink, compression="zstd")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_hashed(self.directory, self.stem, ".parquet", sink.getvalue().to_pybytes())
        except OSError as exc:
            warnings.warn(f"cannot write the table cache {self.directory} ({exc}); the table is not cached",
                          stacklevel=2)
