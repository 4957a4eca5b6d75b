"""Run every notebook with papermill: executed notebooks to results/, figures to figures/.

    dtrlab figures                                  # traces/ -> figures/traces/ (what `make figures` runs)
    DTRLAB_LOGS=../shared/dtr-logs dtrlab figures   # DTR logs -> figures/dtr-logs/
    dtrlab figures --only 01 06 --quick             # a quick run of two notebooks
    dtrlab figures --recompute                      # ignore results/shipped/ (also: DTRLAB_RECOMPUTE=1)
    dtrlab figures --traces traces/models --only 12  # hole anatomy, from results/shipped/anatomy/
    dtrlab figures --traces traces/models --only 03 04   # today's models -> figures/models/
    dtrlab figures --traces traces/models --only 13  # the knob census, from results/shipped/knob/
    dtrlab figures --only 14                        # fit a model into a byte budget (its parameters: source, budget)
    dtrlab figures --cell-timeout 60 --notebook-timeout 300   # tighter limits (0: none)

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

No notebook runs unbounded: each cell has a time limit and so has each whole notebook (:data:`LIMITS`;
``--cell-timeout`` and ``--notebook-timeout``). Past one, the run stops with one line naming the notebook
and the cell, the kernel is shut down, and ``dtrlab figures`` exits 1. The kernels talk to papermill over
Unix sockets (ipc), not TCP; on a machine without an NVIDIA driver the kernels drop the lines torch
prints there about the GPU it lacks (:data:`QUIET_KERNEL`); ``--debug`` (or ``DTRLAB_DEBUG=1``) keeps them.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
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

#: (a cell's limit, a whole notebook's limit) in seconds. ``"shipped"``: a run on traces/ that reads
#: results/shipped/, where the slowest notebook took 197 s (11, real execution, on 2 cores busy with a CI run);
#: ``"recompute"``: --recompute, DTRLAB_RECOMPUTE=1 or another trace set, where a notebook may simulate for
#: hours (08's allocator census of the DTR logs took about two hours from scratch).
LIMITS = {"shipped": (600, 1800), "recompute": (4 * 3600, 8 * 3600)}

#: Run in each kernel before the notebook, unless --debug, where no NVIDIA driver is loaded: the lines torch
#: prints about the GPU such a machine lacks. torch/utils/cpp_extension.py:183 warns "No CUDA runtime is
#: found" whenever a CUDA build of torch finds nvcc or /usr/local/cuda but no device (at its import, line 364);
#: kineto (torch.profiler) logs its start and stop at its USDT level (5) and its failed GPU probe
#: ("gpuGetDeviceCount failed with code 35": no driver) at ERROR (4), so only KINETO_LOG_LEVEL=6 drops the
#: first; it is read when the profiler first starts, so setting it here is in time.
QUIET_KERNEL = ("import logging, os; "
                "logging.getLogger('torch.utils.cpp_extension').addFilter("
                "lambda record: not record.getMessage().startswith('No CUDA runtime is found')); "
                "os.environ.setdefault('KINETO_LOG_LEVEL', '6')")


class NotebookTimeout(Exception):
    """A notebook ran past a limit; its message is the one line ``dtrlab figures`` prints."""


def notebook_paths(only: list[str] | None = None, directory: Path = NOTEBOOKS) -> list[Path]:
    """The numbered notebooks of ``directory``, in order; ``only`` keeps those whose name starts with one of its
    prefixes."""
    if not directory.is_dir():  # an installed copy of the package, not a checkout
        raise FileNotFoundError(f"no notebooks at {directory}: run from a checkout of dtrlab (pip install -e .)")
    paths = sorted(directory.glob("[0-9][0-9]-*.ipynb"))
    if only:
        paths = [p for p in paths if p.name.startswith(tuple(only))]
        if not paths:
            names = ", ".join(p.name for p in sorted(directory.glob("[0-9][0-9]-*.ipynb")))
            raise ValueError(f"no notebook matches {only}; the notebooks are {names}")
    return paths


def notebook_parameters(traces_dir: Path, figures_dir: Path, cache_dir: Path, *, quick: bool, jobs: int,
                        reference: Path | None) -> dict:
    """What papermill injects into each notebook's ``parameters`` cell (absolute paths)."""
    return {"traces_dir": str(traces_dir.resolve()), "figures_dir": str(figures_dir.resolve()),
            "cache_dir": str(cache_dir.resolve()), "quick": quick, "jobs": jobs,
            "reference": str(reference.resolve()) if reference else ""}


def run_notebook(path: Path, output_dir: Path, parameters: dict, *, cell_timeout: float | None = None,
                 notebook_timeout: float | None = None, quiet: bool = True) -> Path:
    """Execute one notebook (in its folder, headless matplotlib); returns the executed copy. ``cell_timeout`` and
    ``notebook_timeout`` (seconds; None: none) bound each cell and the whole run: past one, the kernel is shut
    down and :class:`NotebookTimeout` says where. ``quiet``: :data:`QUIET_KERNEL` where no NVIDIA driver is
    loaded."""
    import papermill
    from nbclient.exceptions import CellTimeoutError
    from traitlets.config import Config

    os.environ["MPLBACKEND"] = "agg"  # the kernel inherits it
    output_dir.mkdir(parents=True, exist_ok=True)
    output = output_dir / path.name
    running: dict = {}

    def cell_limit(cell) -> float | None:
        """The seconds this cell may run: its own limit or what is left of the notebook's, the smaller. The
        notebook's counts from its first cell (papermill gives the kernel's start its own minute)."""
        limits = [(cell_timeout, "cell")] if cell_timeout else []
        if notebook_timeout:  # nbclient reads 0 as no limit: an exhausted notebook gets a millisecond
            deadline = running.setdefault("deadline", time.monotonic() + notebook_timeout)
            limits.append((max(deadline - time.monotonic(), 1e-3), "notebook"))
        running.update(cell=cell, limit=min(limits, key=lambda limit: limit[0]) if limits else None)
        return running["limit"][0] if limits else None

    quiet_kernel = quiet and not Path("/proc/driver/nvidia/version").exists()
    # nbclient logs its own line for a timeout (through papermill's logger): NotebookTimeout's says more
    papermill_log = logging.getLogger("papermill")
    papermill_log.addFilter(_not_nbclient_timeout)
    try:
        # papermill's bar of cells only on a terminal (dtrlab.progress's rule); dtrlab figures prints a line per
        # notebook. ipc: the kernel's sockets are Unix sockets (ipykernel warns about unencrypted TCP).
        # "immediate": the kernel is killed, with its process group and so its sweep workers
        # (jupyter_client/provisioning/local_provisioner.py:89-91); it is idle when a notebook ends, and a
        # graceful shutdown of a kernel a timeout left busy interrupts it and races its reply against its closing
        # sockets (ipykernel prints that traceback).
        papermill.execute_notebook(
            str(path), str(output), parameters=parameters, kernel_name=KERNEL, cwd=str(path.parent),
            progress_bar=interactive(sys.stderr), timeout_func=cell_limit, execution_timeout=cell_timeout,
            config=Config({"KernelManager": {"transport": "ipc"}}), shutdown_kernel="immediate",
            extra_arguments=[f"--IPKernelApp.exec_lines={QUIET_KERNEL}"] if quiet_kernel else [])
    except CellTimeoutError:
        raise NotebookTimeout(_timeout_line(path, running, cell_timeout, notebook_timeout)) from None
    finally:
        papermill_log.removeFilter(_not_nbclient_timeout)
    return output


def _not_nbclient_timeout(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Timeout waiting for execute reply")


def _timeout_line(path: Path, running: dict, cell_timeout, notebook_timeout) -> str:
    """Which limit stopped ``path``, at which cell (its index in the notebook as written, its first line)."""
    cell, which = running["cell"], running["limit"][1]
    cells = json.loads(path.read_text())["cells"]
    index = next((i for i, c in enumerate(cells) if c.get("id") and c.get("id") == cell.get("id")), None)
    where = f"cell {index}" if index is not None else "its injected parameters cell"
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    limit = (f"the {cell_timeout:g} s limit of a cell (--cell-timeout)" if which == "cell"
             else f"the {notebook_timeout:g} s limit of the notebook (--notebook-timeout)")
    return f"{path.name}: {where} ({first[:60]!r}) ran past {limit}; its kernel was shut down"


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
    shipped, recompute = LIMITS["shipped"], LIMITS["recompute"]
    parser.add_argument("--cell-timeout", type=float, metavar="SECONDS",
                        help=f"stop a notebook whose cell runs longer (0: no limit; default {shipped[0]:g} s on "
                        f"traces/ from the shipped results, {recompute[0]:g} s with --recompute or other traces)")
    parser.add_argument("--notebook-timeout", type=float, metavar="SECONDS",
                        help=f"stop a notebook that runs longer in all (0: no limit; default {shipped[1]:g} s, "
                        f"{recompute[1]:g} s with --recompute or other traces)")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help=argparse.SUPPRESS)  # the tests' own


def run(args, parser) -> int:
    """``dtrlab figures``: every notebook chosen, each reported; 1 when one failed."""
    if not args.traces.is_dir():
        parser.error(f"--traces {args.traces} is not a directory; give traces/ or a directory of DTR logs "
                     "such as ../shared/dtr-logs")
    for option in ("cell_timeout", "notebook_timeout"):
        seconds = getattr(args, option)
        if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
            parser.error(f"--{option.replace('_', '-')} {seconds:g}: give seconds, or 0 for no limit")
    if args.recompute:
        os.environ["DTRLAB_RECOMPUTE"] = "1"  # the notebooks' kernels inherit it
    # Parsed traces and monotone's calibration runs use the default cache: keep them beside the sweeps.
    os.environ["DTRLAB_CACHE"] = str(args.cache.resolve())
    simulates = os.environ.get("DTRLAB_RECOMPUTE") == "1" or args.traces.resolve() != (ROOT / "traces").resolve()
    default_cell, default_notebook = LIMITS["recompute" if simulates else "shipped"]
    cell_timeout = default_cell if args.cell_timeout is None else args.cell_timeout or None
    notebook_timeout = default_notebook if args.notebook_timeout is None else args.notebook_timeout or None
    quiet = not (args.debug or os.environ.get("DTRLAB_DEBUG") == "1")
    base = ROOT / "results" / "quick" if args.quick else ROOT
    figures = args.figures or figure_directory(args.traces, base / "figures")
    output = args.output or ROOT / "results" / ("notebooks-quick" if args.quick else "notebooks") / trace_set_name(
        args.traces)
    parameters = notebook_parameters(args.traces, figures, args.cache, quick=args.quick, jobs=args.jobs,
                                     reference=_reference_for(args.traces))
    failed = []
    for path in notebook_paths(args.only, args.notebooks):
        started = time.perf_counter()
        print(f"dtrlab figures: {path.name} on {args.traces} ...", flush=True)
        try:
            run_notebook(path, output, parameters, cell_timeout=cell_timeout, notebook_timeout=notebook_timeout,
                         quiet=quiet)
        except NotebookTimeout as timeout:
            failed.append(path.name)
            print(f"dtrlab figures: {timeout}", file=sys.stderr)
            continue
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

