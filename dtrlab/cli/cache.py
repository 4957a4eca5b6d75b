"""``dtrlab cache list|clean [DIR...]``: what the caches hold; remove what killed writes and quarantines left in
caches and results, and (``--inductor``) Inductor's lowered steps."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..integrity import STALE_AGE_S, is_unfinished_write, remove_stale
from ..trace.cache import default_cache_dir
from ..trace.torch_compile.lowering_cache import FOLDER as LOWERING_FOLDER
from ..memory.device import human_bytes
from .common import finite_float

#: What each cache folder under the root holds, by its name's prefix (the version follows it).
FOLDERS = {"traces-v": "parsed traces (dtrlab.trace.cache)", "inductor-v": "Inductor's lowered steps "
           "(dtrlab.trace.torch_compile.lowering_cache)", "sim-v": "simulation sweeps (dtrlab.sweep.cache)",
           "fit_knob": "fit_knob answers", "errors": "error reports",
           "op-temporaries-v": "operators' measured temporaries (dtrlab.trace.op_temporaries)"}


def hours(text: str) -> float:
    """A finite number of hours >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cache", help="list what a cache holds, or clean it: old unfinished writes, damaged files set aside",
        description="list: per folder below each DIR, how many files and bytes, and what the folder holds (Inductor's "
                    "lowered steps are inductor-vN). clean: remove, below each DIR, the temporary files of atomic "
                    "writes that a killed process left (.NAME.<hex>.tmp) and the damaged files a check moved aside "
                    "(NAME.damaged; their entries were computed again), once older than --older-than; with "
                    "--inductor also every Inductor lowering (they are lowered again when next needed). Caches also "
                    "remove old leftovers from the directory they read.")
    parser.add_argument("action", choices=["list", "clean"], help="what to do (list, clean)")
    parser.add_argument("directories", nargs="*", metavar="DIR",
                        help="directories to list or clean, with everything below them (default: the cache "
                             "directory, $DTRLAB_CACHE or ~/.cache/dtrlab)")
    parser.add_argument("--older-than", type=hours, default=STALE_AGE_S / 3600, metavar="HOURS",
                        help=f"clean: only leftovers older than this (default {STALE_AGE_S / 3600:g}: a write takes "
                             "seconds, so an older temporary file has no live writer)")
    parser.add_argument("--inductor", action="store_true",
                        help="clean: also remove every Inductor lowering entry (inductor-vN/*.npz, any version)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    directories = [Path(d) for d in args.directories]
    for directory in directories:
        if not directory.is_dir():
            raise NotADirectoryError(f"{directory}: not a directory")
    directories = directories or [default_cache_dir()]  # which may not exist yet: then nothing is stale
    for directory in directories:
        if args.action == "list":
            list_folders(directory)
            continue
        stale = remove_stale(directory, recursive=True, min_age_s=args.older_than * 3600, announce=False)
        print(stale.message() if stale.removed else f"no stale files in {directory}")
        if args.inductor:
            removed = remove_lowerings(directory)
            print(f"removed {removed} Inductor lowering{'' if removed == 1 else 's'} from {directory}")
    return 0


def list_folders(directory: Path) -> None:
    """One line per folder below ``directory``: its name, files (leftovers of unfinished writes and damaged files
    apart), bytes and what it holds."""
    folders = sorted(p for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else []
    if not folders:
        print(f"{directory}: no cache folders")
        return
    print(f"{directory}:")
    for folder in folders:
        files = [p for p in folder.rglob("*") if p.is_file()]
        leftovers = sum(is_unfinished_write(p.name) or p.name.endswith(".damaged") for p in files)
        size = sum(p.stat().st_size for p in files)
        what = next((text for prefix, text in FOLDERS.items() if folder.name.startswith(prefix)), "")
        stale = "" if not folder.name.startswith("inductor-v") or folder.name == LOWERING_FOLDER else \
            ", another version: never read (clean --inductor removes it)"
        print(f"  {folder.name}: {len(files) - leftovers} files, {human_bytes(size)}"
              + (f", {leftovers} leftovers" if leftovers else "") + (f"  {what}" if what else "") + stale)


def remove_lowerings(directory: Path) -> int:
    """Remove every Inductor lowering entry (any version's folder) below ``directory``; returns how many."""
    removed = 0
    for path in directory.rglob("inductor-v*/*.npz"):
        try:
            path.unlink()
            removed += 1
        except OSError:
            continue
    return removed
