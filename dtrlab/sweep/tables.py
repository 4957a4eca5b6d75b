"""Cached result tables of analyses that are not sweeps (e.g. an intervention search).

A :class:`TableCache` stores one DataFrame per (trace, kind, configuration) next to
the sweep cache, ``ROOT/sim-v{SIMULATOR_VERSION}/{trace hash}/tables/{kind}-{key}.parquet``,
with the trace hash, simulator version and full key in the parquet metadata. Like
sweep rows, a table is also looked up in the read-only shipped bundle
(``results/shipped/<trace set>/tables/``, :mod:`dtrlab.sweep.shipped`) and used only
if its simulator version, trace hash and key all match.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..runtime import SIMULATOR_VERSION
from ..trace.model import Trace
from .shipped import METADATA_KEY, shipped_dir, verified


class TableCache:
    """One cached table: ``kind`` names the analysis, ``config`` (JSON-able) what its result depends on."""

    def __init__(self, root: str | os.PathLike, trace: Trace, kind: str, config: dict):
        self.key = {"simulator_version": SIMULATOR_VERSION, "trace": trace.name, "trace_hash": trace.content_hash,
                    "kind": kind, "config": config}
        digest = hashlib.sha256(json.dumps({"kind": kind, "config": config}, sort_keys=True, default=repr).encode())
        self.name = f"{kind}-{digest.hexdigest()[:24]}.parquet"
        self.path = Path(root) / f"sim-v{SIMULATOR_VERSION}" / trace.content_hash[:24] / "tables" / self.name

    def load(self) -> pd.DataFrame | None:
        """The cached table (the writable cache's, else the shipped one), or None."""
        candidates = [self.path]
        bundle = shipped_dir()
        if bundle is not None:  # shipped tables only if they match the bundle's manifest
            candidates += [p for p in sorted(bundle.glob(f"*/tables/{self.name}")) if verified(p, bundle)]
        for path in candidates:
            if path.is_file() and self._valid(path):
                return pd.read_parquet(path)
        return None

    def _valid(self, path: Path) -> bool:
        metadata = json.loads((pq.read_schema(path).metadata or {}).get(METADATA_KEY, b"{}"))
        return all(metadata.get(k) == self.key[k] for k in ("simulator_version", "trace_hash", "kind")) and \
            json.dumps(metadata.get("config"), sort_keys=True, default=repr) == \
            json.dumps(self.key["config"], sort_keys=True, default=repr)

    def store(self, table: pd.DataFrame) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        arrow = pa.Table.from_pandas(table, preserve_index=False)
        metadata = {**(arrow.schema.metadata or {}), METADATA_KEY: json.dumps(self.key, sort_keys=True,
                                                                             default=repr).encode()}
        temporary = self.path.with_name(f".{self.name}.tmp")
        pq.write_table(arrow.replace_schema_metadata(metadata), temporary, compression="zstd")
        os.replace(temporary, self.path)
