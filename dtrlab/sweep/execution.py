"""``Execution``: how many runs are carried out, as one frozen value.

Where runs go (``jobs`` local processes with ``backend``, or a Dask ``client``), whether they are
cached (``cache``) and whether progress is shown (``progress``) never change an outcome; they
travel together through every sweep, census and search as one ``Execution``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Execution:
    """``jobs``: local worker processes (``-1``: one per core); ``backend``: ``"sequential"``,
    ``"fork"`` (processes forked from this one, sharing what it holds; POSIX only), ``"loky"`` or
    ``"dask"`` (see :data:`dtrlab.sweep.BACKENDS` and :class:`dtrlab.sweep.engine.Workers`); ``client``: a Dask client or scheduler address
    (runs go there); ``cache``: True (``$DTRLAB_CACHE`` or ``~/.cache/dtrlab``), a directory, or
    False; ``progress``: show a progress bar."""

    jobs: int = 1
    backend: str = "loky"
    client: object = None
    cache: bool | str | os.PathLike = True
    progress: bool = True

    def with_(self, **changes) -> "Execution":
        """A copy with ``changes`` (``Execution().with_(jobs=2)``)."""
        return replace(self, **changes)

    @property
    def uncached(self) -> "Execution":
        """The same execution without a cache."""
        return replace(self, cache=False)


SERIAL = Execution()
#: :data:`SERIAL` without a progress bar (for the many small sweeps inside an analysis).
QUIET = Execution(progress=False)
