"""Wall time of every notebook under papermill with default parameters, as on a fresh clone.

    python benchmarks/bench_notebooks.py                  # empty sweep cache, shipped layer in use
    python benchmarks/bench_notebooks.py --recompute      # empty cache, shipped layer ignored
    python benchmarks/bench_notebooks.py --only 01 04 --cells

Each notebook runs in a fresh kernel against a new, empty sweep cache (a temporary
directory, removed afterwards unless ``--keep-cache``), so nothing computed by one
notebook speeds up the next: this is what a user who opens one notebook on a fresh
clone waits for. Figures go to a temporary directory; the committed figures are not
touched. Prints a Markdown table (seconds per notebook and its slowest cell);
``--cells`` adds every cell that took longer than one second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dtrlab.pipeline import figures as make_figures  # the figure pipeline: one place for paths and papermill

ROOT = Path(__file__).resolve().parent.parent


def cell_durations(executed: Path) -> list[tuple[int, float, str]]:
    """(cell index, seconds, first source line) of every code cell papermill timed."""
    cells = json.loads(executed.read_text())["cells"]
    timed = []
    for index, cell in enumerate(cells):
        seconds = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if cell["cell_type"] == "code" and seconds is not None:
            first_line = "".join(cell["source"]).strip().splitlines()[0] if cell["source"] else ""
            timed.append((index, float(seconds), first_line[:60]))
    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=ROOT / "traces", help="trace directory (default traces/)")
    parser.add_argument("--jobs", type=int, default=2, help="processes per sweep (the notebooks' default: 2)")
    parser.add_argument("--only", nargs="+", metavar="NN", help="time only these notebooks, e.g. --only 01 04")
    parser.add_argument("--recompute", action="store_true",
                        help="ignore the shipped results (sets DTRLAB_RECOMPUTE=1 for the kernels)")
    parser.add_argument("--cells", action="store_true", help="also list every cell slower than one second")
    parser.add_argument("--keep-cache", type=Path, metavar="DIR",
                        help="use DIR (must be empty or absent) as the one cache of all notebooks and keep it")
    args = parser.parse_args(argv)

    if args.recompute:
        os.environ["DTRLAB_RECOMPUTE"] = "1"
    work = Path(tempfile.mkdtemp(prefix="bench-notebooks-"))
    rows, slow_cells = [], []
    try:
        for path in make_figures.notebook_paths(args.only):
            cache = args.keep_cache or work / f"cache-{path.stem}"
            parameters = make_figures.notebook_parameters(args.traces, work / "figures", cache, quick=False,
                                                          jobs=args.jobs, reference=None)
            started = time.perf_counter()
            executed = make_figures.run_notebook(path, work / "executed", parameters)
            seconds = time.perf_counter() - started
            cells = cell_durations(executed)
            slowest = max(cells, key=lambda c: c[1])
            rows.append((path.name, seconds, slowest))
            slow_cells += [(path.name, *c) for c in cells if c[1] > 1.0]
            print(f"bench_notebooks: {path.name} {seconds:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    layer = "ignored (--recompute)" if args.recompute else "in use"
    print(f"\nEmpty sweep cache per notebook, shipped layer {layer}, jobs={args.jobs}, {os.cpu_count()} cores\n")
    print("| notebook | seconds | slowest cell | its seconds |")
    print("|---|---:|---|---:|")
    for name, seconds, (index, cell_seconds, line) in rows:
        print(f"| {name} | {seconds:.1f} | [{index}] `{line}` | {cell_seconds:.1f} |")
    print(f"| **total** | {sum(r[1] for r in rows):.1f} | | |")
    if args.cells:
        print("\n| notebook | cell | seconds | first line |\n|---|---:|---:|---|")
        for name, index, cell_seconds, line in slow_cells:
            print(f"| {name} | {index} | {cell_seconds:.1f} | `{line}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
