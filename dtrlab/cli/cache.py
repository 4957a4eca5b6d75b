"""``dtrlab cache clean [DIR...]``: remove what killed writes and quarantines left in caches and results."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..integrity import STALE_AGE_S, remove_stale
from ..trace.cache import default_cache_dir
from .common import finite_float


def hours(text: str) -> float:
    """A finite number of hours >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cache", help="clean a cache: remove old unfinished writes and damaged files set aside",
        description="Remove, below each DIR, the temporary files of atomic writes that a killed process left "
                    "(.NAME.<hex>.tmp) and the damaged files a check moved aside (NAME.damaged; their entries "
                    "were computed again), once older than --older-than. Caches also do this for the directory "
                    "they read.")
    parser.add_argument("action", choices=["clean"], help="what to do (clean)")
    parser.add_argument("directories", nargs="*", metavar="DIR",
                        help="directories to clean, with everything below them (default: the cache directory, "
                             "$DTRLAB_CACHE or ~/.cache/dtrlab)")
    parser.add_argument("--older-than", type=hours, default=STALE_AGE_S / 3600, metavar="HOURS",
                        help=f"only files older than this (default {STALE_AGE_S / 3600:g}: a write takes seconds, "
                             "so an older temporary file has no live writer)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    directories = [Path(d) for d in args.directories]
    for directory in directories:
        if not directory.is_dir():
            raise NotADirectoryError(f"{directory}: not a directory")
    directories = directories or [default_cache_dir()]  # which may not exist yet: then nothing is stale
    for directory in directories:
        stale = remove_stale(directory, recursive=True, min_age_s=args.older_than * 3600, announce=False)
        print(stale.message() if stale.removed else f"no stale files in {directory}")
    return 0
