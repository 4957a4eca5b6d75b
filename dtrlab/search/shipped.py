"""Reading the shipped search results (``results/shipped/search/``, written by ``dtrlab ship search``).

Each CSV file is read only if it matches its entry in the bundle's ``MANIFEST.json``
(``results/shipped/MANIFEST.json`` for the files in the shipped bundle, else the
directory's own); notebook 10 reads them so.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..integrity import IntegrityError, verify_in_manifest
from ..sweep.shipped import DEFAULT_SHIPPED_DIR


def manifest_root(out: Path) -> Path:
    """The directory whose MANIFEST.json lists ``out``'s files: the shipped bundle's if ``out`` is in it."""
    bundle = DEFAULT_SHIPPED_DIR.resolve()
    return bundle if out.resolve().is_relative_to(bundle) else out


def read_shipped_csv(path: str | Path) -> pd.DataFrame:
    """A CSV file of the shipped search results, checked against its bundle's MANIFEST.json first.

    Raises :class:`~dtrlab.integrity.IntegrityError` (one line: the file, why, and how to mend it)
    when it is not listed, or its size or sha256 differs, or the manifest is missing or damaged.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no shipped search result {path} (dtrlab ship search writes it)")
    try:
        verify_in_manifest(path, manifest_root(path.parent))
    except (IntegrityError, FileNotFoundError) as exc:  # the latter: no manifest
        raise IntegrityError(f"refusing the shipped search result {path}: {exc} (regenerate it with "
                             "dtrlab ship search, or restore it with git)") from None
    return pd.read_csv(path)
