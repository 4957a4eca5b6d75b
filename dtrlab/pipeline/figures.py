"""Run every notebook with papermill: executed notebooks to results/, figures to figures/.

    dtrlab figures                                  # traces/ -> figures/traces/ (what `make figures` runs)
    DTRLAB_LOGS=../shared/dtr-logs dtrlab figures   # DTR logs -> figures/dtr-logs/
    dtrlab figures --only 01 06 --quick             # a quick run of two notebooks
    dtrlab figures --recompute                      # ignore results/shipped/ (also: DTRLAB_RECOMPUTE=1)
    dtrlab figures --traces traces/models --only 12  # hole anatomy, from results/shipped/anatomy/
    dtrlab figures --traces traces/models --only 03 04   # today's models -> figures/models/
    dtrlab figures --traces traces/models --only 13  # the knob census, from results/shipped/knob/
    dtrlab figures --only 14                        # fit a model into a byte budget (its parameters: source, budget)

Figures go to ``figures/<trace set>/`` (the trace set is the name of the traces
directory, so the DTR logs never overwrite the shipped traces' figures, and a
``--quick`` run writes under ``results/`` instead); a notebook run by hand with an
empty ``figures_dir`` derives the same directory from its ``traces_dir``
(``dtrlab.plots.figure_directory``). Executed notebooks go to
``results/notebooks/<trace set>/``. Every notebook reads the same sweep cache
(``$DTRLAB_CACHE`` or ``results/cache``), so reruns only plot. Below that cache lie
the shipped results (``results/shipped/``, validated row by row), so a fresh clone
only plots too; ``--recompute`` (or ``DTRLAB_RECOMPUTE=1``, e.g.
``make figures DTRLAB_RECOMPUTE=1``) simulates everything the cache lacks instead.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..plots.style import figure_directory, trace_set_name  # the notebooks derive figures_dir the same way
from ..progress import interactive

#: The checkout dtrlab is installed from (``pip install -e``): the notebooks, traces and results live there.
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "python3"


def notebook_paths(only: list[str] | None = None) -> list[Path]:
    """The numbered notebooks, in order; ``only`` keeps those whose name starts with one of its prefixes."""
    if not NOTEBOOKS.is_dir():  # an installed copy of the package, not a checkout
        raise FileNotFoundError(f"no notebooks at {NOTEBOOKS}: run from a checkout of dtrlab (pip install -e .)")
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
    if only:
        paths = [p for p in paths if p.name.startswith(tuple(only))]
        if not paths:
            names = ", ".join(p.name for p in sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")))
            raise ValueError(f"no notebook matches {only}; the notebooks are {names}")
    return paths


def notebook_parameters(traces_dir: Path, figures_dir: Path, cache_dir: Path, *, quick: bool, jobs: int,
                        reference: Path | None) -> dict:
    """What papermill injects into each notebook's ``parameters`` cell (absolute paths)."""
    return {"traces_dir": str(traces_dir.resolve()), "figures_dir": str(figures_dir.resolve()),
            "cache_dir": str(cache_dir.resolve()), "quick": quick, "jobs": jobs,
            "reference": str(reference.resolve()) if reference else ""}


def run_notebook(path: Path, output_dir: Path, parameters: dict) -> Path:
    """Execute one notebook (in the notebooks folder, headless matplotlib); returns the executed copy."""
    import papermill

    os.environ["MPLBACKEND"] = "agg"  # the kernel inherits it
    output_dir.mkdir(parents=True, exist_ok=True)
    output = output_dir / path.name
    # papermill's bar of cells only on a terminal (dtrlab.progress's rule); dtrlab figures prints a line per notebook
    papermill.execute_notebook(str(path), str(output), parameters=parameters, kernel_name=KERNEL,
                               cwd=str(NOTEBOOKS), progress_bar=interactive(sys.stderr))
    return output


def _reference_for(traces_dir: Path) -> Path | None:
    """simrd's reference outcomes next to the DTR logs (``../shared/reference``), when present."""
    candidate = traces_dir.resolve().parent / "reference" / "simrd-outcomes.jsonl"
    return candidate if candidate.is_file() else None


def add_arguments(parser) -> None:
    """The options of ``dtrlab figures``."""
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("DTRLAB_LOGS") or ROOT / "traces"),
                        help="directory of traces or DTR logs (default: $DTRLAB_LOGS, else traces/)")
    parser.add_argument("--figures", type=Path, help="figure directory (default figures/<trace set>/)")
    parser.add_argument("--output", type=Path, help="executed notebooks (default results/notebooks/<trace set>/)")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("DTRLAB_CACHE") or ROOT / "results" / "cache"),
                        help="sweep cache shared by all notebooks (default: $DTRLAB_CACHE, else results/cache)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes per sweep (default: all cores)")
    parser.add_argument("--quick", action="store_true", help="tiny runs (as the tests do); figures go under results/")
    parser.add_argument("--only", nargs="+", metavar="NN", help="run only these notebooks, e.g. --only 01 06")
    parser.add_argument("--recompute", action="store_true",
                        help="ignore the shipped results in results/shipped/ (same as DTRLAB_RECOMPUTE=1)")


def run(args, parser) -> int:
    """``dtrlab figures``: every notebook chosen, each reported; 1 when one failed."""
    if args.recompute:
        os.environ["DTRLAB_RECOMPUTE"] = "1"  # the notebooks' kernels inherit it
    # Parsed traces and monotone's calibration runs use the default cache: keep them beside the sweeps.
    os.environ["DTRLAB_CACHE"] = str(args.cache.resolve())

    if not args.traces.is_dir():
        parser.error(f"--traces {args.traces} is not a directory; give traces/ or a directory of DTR logs "
                     "such as ../shared/dtr-logs")
    base = ROOT / "results" / "quick" if args.quick else ROOT
    figures = args.figures or figure_directory(args.traces, base / "figures")
    output = args.output or ROOT / "results" / ("notebooks-quick" if args.quick else "notebooks") / trace_set_name(
        args.traces)
    parameters = notebook_parameters(args.traces, figures, args.cache, quick=args.quick, jobs=args.jobs,
                                     reference=_reference_for(args.traces))
    failed = []
    for path in notebook_paths(args.only):
        started = time.perf_counter()
        print(f"dtrlab figures: {path.name} on {args.traces} ...", flush=True)
        try:
            run_notebook(path, output, parameters)
        except Exception as exc:  # report every notebook, then fail
            failed.append(path.name)
            print(f"dtrlab figures: {path.name} FAILED: {exc}", file=sys.stderr)
            continue
        print(f"dtrlab figures: {path.name} done in {time.perf_counter() - started:.0f} s", flush=True)
    print(f"dtrlab figures: figures in {figures}, executed notebooks in {output}")
    if failed:
        print(f"dtrlab figures: {len(failed)} notebook(s) failed: {', '.join(failed)} "
              f"(the executed copies in {output} show the failing cell)", file=sys.stderr)
        return 1
    return 0

