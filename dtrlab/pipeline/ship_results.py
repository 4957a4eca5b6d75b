"""Regenerate results/shipped/, the committed sweep results the notebooks read on a fresh clone.

    dtrlab ship results                  # traces/ (every notebook) + the DTR logs' census
    dtrlab ship results --no-logs        # the shipped traces only
    dtrlab ship results --cache DIR      # keep the computed cache in DIR (reruns reuse it)

Run it after anything that bumps ``SIMULATOR_VERSION`` (or changes the notebooks'
default parameters, or the traces): the old bundle's rows are then ignored, not
wrong, but every notebook is slow again until the bundle is regenerated.

How: every notebook runs with papermill and its default parameters on ``traces/``,
and notebooks 01, 02 and 08 (the censuses behind ``figures/dtr-logs/``) on the DTR logs
(``$DTRLAB_LOGS``, else ``../shared/dtr-logs`` when present), all with
``DTRLAB_RECOMPUTE=1`` against an empty cache, so the bundle holds exactly the runs
the notebooks ask for, computed by this simulator. Then each trace's cached rows
are packed into ``results/shipped/<trace set>/<trace name>.parquet``
(:mod:`dtrlab.sweep.shipped`), and so are the cached analysis tables (notebook 03's
intervention search). Only verified cache files are packed (a damaged part or
``key.json`` is skipped with a warning). Last, the sha256 and size of every file
written are recorded in ``results/shipped/MANIFEST.json`` (the other entries are
kept), which the shipped layer checks before it reads a file. Figures go to a
temporary directory unless ``--figures``.

    dtrlab ship results --manifest-only  # rehash every file of the bundle (after checking them)
    dtrlab ship results --merge 10 --sets traces models --cache DIR --figures figures
    dtrlab ship results --allocator-census [traces dtr-logs models] --cache DIR --figures figures

``--merge NN ...`` runs only those notebooks on the trace sets of ``--sets`` (default traces/),
reading the bundle as it is (not ``DTRLAB_RECOMPUTE``), so only the runs it lacks are
simulated, and adds them to each trace's bundle file, whose other rows stay
(:func:`merge_pack`). A ``--cache`` filled beforehand (the same runs, e.g. from
``dtrlab ship search`` for notebook 10) makes it plot only.
``--allocator-census`` is ``--merge 08`` on traces/, the DTR logs and traces/models (where the
notebook adds an A100's 80 GB as a device and runs h_DTR and Coop only): the allocator census under
both runtime semantics.
    dtrlab ship results --execute-only   # notebook 11's real runs only (about 15 s here)

Notebook 11's real runs (training steps executed around a census hole) are shipped as JSON
records in ``results/shipped/execute/`` (:mod:`dtrlab.execute.record`): the notebook writes
each real run's record to ``<cache>/execute/``, from where they are copied. Their wall
times are this machine's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd

from ..execute.record import SHIPPED_SUBDIR as EXECUTE_SUBDIR
from ..integrity import IntegrityError, write_manifest
from ..sweep.cache import rows_from_cache
from ..sweep.shipped import (
    DEFAULT_SHIPPED_DIR, RECOMPUTE_ENV, bundle_table, read_metadata, tables_from_cache, verified, write_bundle_file)
from ..trace import load_directory
from . import figures as make_figures
from .figures import ROOT

#: The notebooks whose runs are shipped, per trace set: all for traces/; for the DTR logs the census
#: (01's grid, on which 03, 05 and 07 find their hole, and 02's finer census) and the allocator
#: census (08: about two hours on 2 cores, most of it Coop and dtr_fit on the Python simulator).
LOG_NOTEBOOKS = ["01", "02", "08"]
#: The notebook whose real runs (not sweeps) are shipped, in results/shipped/execute/.
EXECUTE_NOTEBOOK = "11"
#: The allocator census (--allocator-census); on traces/models the notebook's defaults add an A100's
#: 80 GB and leave dtr_fit out (issue 20).
ALLOCATOR_NOTEBOOK = "08"
MERGE_SETS = ("traces", "dtr-logs", "models")


def default_logs() -> Path | None:
    candidate = Path(os.environ.get("DTRLAB_LOGS") or ROOT.parent / "shared" / "dtr-logs")
    return candidate if candidate.is_dir() else None


def run_notebooks(traces_dir: Path, cache: Path, work: Path, figures: Path, only: list[str] | None,
                  skip: list[str], jobs: int) -> None:
    name = make_figures.trace_set_name(traces_dir)
    parameters = make_figures.notebook_parameters(traces_dir, figures / name, cache, quick=False, jobs=jobs,
                                                  reference=None)
    for path in make_figures.notebook_paths(only):
        if path.name.startswith(tuple(skip)):
            continue
        started = time.perf_counter()
        print(f"dtrlab ship results: {path.name} on {traces_dir} ...", flush=True)
        make_figures.run_notebook(path, work / "executed" / name, parameters)
        print(f"dtrlab ship results: {path.name} done in {time.perf_counter() - started:.0f} s", flush=True)


def pack(traces_dir: Path, cache: Path, output: Path) -> list[tuple[str, int, int]]:
    """Write one bundle file per trace of ``traces_dir`` that has cached rows; (file, rows, bytes) each."""
    shutil.rmtree(output, ignore_errors=True)  # traces that left the set leave the bundle too
    written = []
    for name, trace in load_directory(traces_dir).items():
        rows, configs = rows_from_cache(cache, trace.content_hash)
        if len(rows):
            path = output / f"{name}.parquet"
            write_bundle_file(bundle_table(rows, trace=name, trace_hash=trace.content_hash, configs=configs), path)
            written.append((path, len(rows)))
        for table in tables_from_cache(cache, trace.content_hash):
            path = output / "tables" / table.name
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(table, path)  # write_manifest below hashes the copy
            written.append((path, len(pd.read_parquet(path))))
    return [(path, rows, path.stat().st_size) for path, rows in written]


def merge_pack(traces_dir: Path, cache: Path, output: Path) -> list[tuple[str, int, int]]:
    """Add each trace's cached rows to its bundle file in ``output``, keeping the file's other rows (a
    cached row replaces a shipped one of the same configuration and budget); (file, rows, bytes) each.
    A bundle file that does not match the manifest is refused, not merged."""
    written = []
    for name, trace in load_directory(traces_dir).items():
        rows, configs = rows_from_cache(cache, trace.content_hash)
        if not len(rows):
            continue
        path = output / f"{name}.parquet"
        if path.exists():
            if not verified(path, output.parent):
                raise IntegrityError(f"{path} does not match {output.parent / 'MANIFEST.json'}; "
                                     "regenerate the bundle instead of merging into it")
            rows = pd.concat([pd.read_parquet(path), rows], ignore_index=True)
            rows = rows.drop_duplicates(["config_key", "budget_bytes"], keep="last")
            configs = read_metadata(path)["configs"] | configs
        write_bundle_file(bundle_table(rows, trace=name, trace_hash=trace.content_hash, configs=configs), path)
        written.append((path, len(rows), path.stat().st_size))
    return written


def pack_execute(cache: Path, output: Path) -> list[tuple[str, int, int]]:
    """Copy the real runs' records the notebooks wrote to ``cache/execute/`` into ``output``; (file, 1, bytes) each."""
    records = sorted((cache / EXECUTE_SUBDIR).glob("*.json"))
    if not records:
        raise FileNotFoundError(f"notebook {EXECUTE_NOTEBOOK} wrote no real run to {cache / EXECUTE_SUBDIR}")
    shutil.rmtree(output, ignore_errors=True)  # runs the notebook no longer makes leave the bundle too
    output.mkdir(parents=True)
    for record in records:
        shutil.copyfile(record, output / record.name)  # write_manifest below hashes the copy
    return [(output / r.name, 1, (output / r.name).stat().st_size) for r in records]


def add_arguments(parser) -> None:
    """The options of ``dtrlab ship results``."""
    parser.add_argument("--traces", type=Path, default=ROOT / "traces", help="the shipped traces (default traces/)")
    parser.add_argument("--logs", type=Path, default=default_logs(),
                        help="the DTR logs (default: $DTRLAB_LOGS, else ../shared/dtr-logs when present)")
    parser.add_argument("--no-logs", action="store_true", help="leave the DTR logs' part of the bundle as it is")
    parser.add_argument("--cache", type=Path, help="sweep cache to fill and pack (default: a new temporary one)")
    parser.add_argument("--output", type=Path, default=DEFAULT_SHIPPED_DIR, help="bundle directory (default results/shipped)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes per sweep")
    parser.add_argument("--skip", nargs="+", default=[], metavar="NN",
                        help="notebooks not to run (their runs are then not shipped), e.g. --skip 09")
    parser.add_argument("--figures", type=Path, help="keep the recomputed figures in DIR/<trace set>/ (to compare "
                        "with a run on the shipped layer; default: discarded)")
    parser.add_argument("--manifest-only", action="store_true",
                        help="only rewrite OUTPUT/MANIFEST.json from the files as they are (every file is trusted: "
                             "run tests/test_shipped.py's slow tests first)")
    parser.add_argument("--execute-only", action="store_true",
                        help=f"only run notebook {EXECUTE_NOTEBOOK} and ship its real runs (OUTPUT/{EXECUTE_SUBDIR}/); "
                             "the rest of the bundle stays as it is")
    parser.add_argument("--merge", nargs="+", metavar="NN",
                        help="only run these notebooks on the --sets and add their runs to the sets' bundle files "
                             "(the rest of the bundle stays)")
    parser.add_argument("--sets", nargs="+", choices=MERGE_SETS, default=["traces"], metavar="SET",
                        help=f"the trace sets of --merge ({', '.join(MERGE_SETS)}; default traces)")
    parser.add_argument("--allocator-census", nargs="*", choices=MERGE_SETS, metavar="SET",
                        help=f"--merge {ALLOCATOR_NOTEBOOK} on these trace sets (default all)")


def run(args, parser) -> int:
    """``dtrlab ship results``: the bundle regenerated, or merged into (``--merge``, ``--allocator-census``)."""
    if args.allocator_census is not None:
        return ship_merged(args, [ALLOCATOR_NOTEBOOK], args.allocator_census or MERGE_SETS)
    if args.merge:
        return ship_merged(args, args.merge, args.sets)
    if args.manifest_only:
        manifest = write_manifest(args.output)
        print(f"dtrlab ship results: {args.output / 'MANIFEST.json'}: {len(manifest['files'])} files")
        return 0

    sets = [(args.traces, [EXECUTE_NOTEBOOK] if args.execute_only else None)]
    if not (args.no_logs or args.execute_only):
        if args.logs is None or not args.logs.is_dir():
            parser.error("no DTR logs found (set $DTRLAB_LOGS or --logs, or pass --no-logs to ship traces/ only)")
        sets.append((args.logs, LOG_NOTEBOOKS))
    os.environ[RECOMPUTE_ENV] = "1"  # computed by this simulator, never copied from the old bundle
    os.environ["MPLBACKEND"] = "agg"
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ship-results-"))
    cache = args.cache or work / "cache"
    try:
        written = []
        for traces_dir, only in sets:
            run_notebooks(traces_dir, cache, work, args.figures or work / "figures", only, args.skip, args.jobs)
            if not args.execute_only:
                written += pack(traces_dir, cache, args.output / traces_dir.resolve().name)
        if not EXECUTE_NOTEBOOK.startswith(tuple(args.skip)):
            written += pack_execute(cache, args.output / EXECUTE_SUBDIR)
        write_manifest(args.output, [path for path, _, _ in written])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for path, rows, size in written:
        print(f"dtrlab ship results: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {rows} rows, "
              f"{size / 1e3:.0f} kB")
    total = sum(size for _, _, size in written)
    print(f"dtrlab ship results: {len(written)} files, {total / 1e6:.2f} MB, in {time.perf_counter() - started:.0f} s")
    return 0


def ship_merged(args, notebooks: list[str], chosen) -> int:
    """``--merge`` (and ``--allocator-census``): ``notebooks`` on the trace sets ``chosen``, their new
    runs merged into the bundle."""
    if "dtr-logs" in chosen and (args.logs is None or not args.logs.is_dir()):
        raise FileNotFoundError("no DTR logs found (set $DTRLAB_LOGS or --logs)")
    sets = {"traces": args.traces, "dtr-logs": args.logs, "models": args.traces / "models"}
    os.environ["MPLBACKEND"] = "agg"
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ship-merge-"))
    cache = args.cache or work / "cache"
    try:
        written = []
        for traces_dir in (sets[name] for name in chosen):
            run_notebooks(traces_dir, cache, work, args.figures or work / "figures", notebooks, [], args.jobs)
            merged = merge_pack(traces_dir, cache, args.output / traces_dir.resolve().name)
            write_manifest(args.output, [path for path, _, _ in merged])  # per set: a rerun can merge again
            written += merged
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for path, rows, size in written:
        print(f"dtrlab ship results: {path}: {rows} rows, {size / 1e3:.0f} kB")
    print(f"dtrlab ship results: {len(written)} files in {time.perf_counter() - started:.0f} s")
    return 0

