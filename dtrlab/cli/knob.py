"""``dtrlab knob SOURCE --knobs 0:1:0.01 --budget 40GiB --out DIR``: census torch.compile's activation-memory knob.

SOURCE is a model source as for ``dtrlab capture`` (traced once per process: here, and in each loky or
Dask worker with ``--executor``; torch's own partitioner runs at every knob value, dtrlab.trace.torch_compile.partition;
by default each partition is then lowered by Inductor, dtrlab.trace.torch_compile.inductor, for the CPU or for
``--device``'s GPU without one, dtrlab.trace.torch_compile.cuda_joint; ``--backend aot_eager`` runs the graphs node by
node) or a census JSON written before (read back verified, no torch needed). See docs/compile.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import time
from pathlib import Path

from ..memory.device import PEAK_ACCOUNTINGS, budget_bytes, human_bytes
from .capture import add_model_size_arguments, add_precision_arguments, precision_options
from .common import jobs_count, model_source, positive_float, positive_size, print_table


def knob_range(text: str) -> dict:
    """``--knobs``: ``START:STOP:STEP`` or a list, each value in [0, 1] (:class:`KnobPlan` fields)."""
    from ..analysis.knob_census import parse_knobs

    try:
        return parse_knobs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def byte_budget(text: str) -> int:
    """``--budget``: bytes, a size such as ``40GiB`` or a GPU preset such as ``A100-80GB``."""
    try:
        return budget_bytes(positive_size(text))[0]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _names(text: str, choices: tuple[str, ...], what: str) -> tuple[str, ...]:
    from ..suggest import did_you_mean

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        if name not in choices:
            raise argparse.ArgumentTypeError(f"unknown {what} {name!r}{did_you_mean(name, choices)}; choose from "
                                             f"{', '.join(choices)}")
    if not names:
        raise argparse.ArgumentTypeError(f"give at least one {what}")
    return names


def lowering_device(text: str) -> str:
    """``--device``: ``cpu`` or a GPU preset (H100-80GB, ...): the device Inductor lowers the step for."""
    from ..memory.device import GPU_PRESETS
    from ..suggest import did_you_mean

    if text != "cpu" and text not in GPU_PRESETS:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}{did_you_mean(text, ['cpu', *GPU_PRESETS])}; give "
                                         f"cpu or a GPU: {', '.join(GPU_PRESETS)}")
    return text


def lowering_gpu(args) -> str | None:
    """The GPU preset the step is lowered for: knob's ``--device``, or check's when it names a preset (check's
    ``--device`` may also be bytes or a size: the CPU lowering then); None for the CPU."""
    from ..memory.device import gpu_preset

    return gpu_preset(getattr(args, "device", "cpu"))


def solver_list(text: str) -> tuple[str, ...]:
    """``--solver dp,greedy``: knapsack solvers torch's partitioner knows."""
    from ..trace.torch_compile.partition import SOLVERS

    return _names(text, SOLVERS, "solver")


def estimator_list(text: str) -> tuple[str, ...]:
    """``--runtime-estimator flops,testing``: the partitioner's runtime estimators."""
    from ..trace.torch_compile.partition import RUNTIME_ESTIMATORS

    return _names(text, RUNTIME_ESTIMATORS, "runtime estimator")


def census_or_model_source(text: str) -> str:
    """A census JSON that exists, or a model source checked before torch is imported (:func:`model_source`)."""
    if not text.endswith(".json"):
        return model_source(text)
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no census file {text} (a census JSON written by dtrlab knob --out, or a "
                                         "model source)")
    return text


def output_directory(text: str) -> str:
    """A directory to write into, checked before any work: not a file, and writable or creatable."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; --out names a directory")
    existing = next(p for p in [path.absolute(), *path.absolute().parents] if p.exists())
    if not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {existing} is not writable")
    return text


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "knob", help="census torch.compile's activation_memory_budget knob: the peak at every knob value, where "
        "lowering it raises the peak, the holes in byte terms, and the knob that fits a byte budget (docs/compile.md)")
    parser.add_argument("source", metavar="SOURCE", type=census_or_model_source,
                        help="a model source as for `dtrlab capture` (zoo name, torchvision:, hf:, diffusers:, "
                             "module:function), or a census JSON written by --out")
    add_model_size_arguments(parser)
    add_precision_arguments(parser)
    add_backend_argument(parser, "--backend")
    parser.add_argument("--device", type=lowering_device, default="cpu", metavar="DEVICE",
                        help="the device the step is traced and lowered for: cpu (default; CPU Inductor's lowering) "
                             "or a GPU such as H100-80GB (CUDA Inductor's lowering and CUDA's attention kernels, on "
                             "fake tensors: no GPU needed; not yet measured on a GPU)")
    parser.add_argument("--knobs", type=knob_range, default=None, metavar="START:STOP:STEP",
                        help="knob values to evaluate: a range with both ends included, or a list such as 0.05,0.15 "
                             "(default 0:1:0.01 under aot_eager, 0:1:0.1 under inductor: each distinct partition "
                             "costs a lowering); every change of the peak between neighbours is then bisected")
    parser.add_argument("--resolution", type=positive_float, default=None,
                        help="bisect every change of the peak down to this knob width (default 1e-4 under "
                             "aot_eager, 0.025 under inductor)")
    parser.add_argument("--refine", choices=("changes", "against"), default=None,
                        help="bisect every change of the peak (aot_eager's default), or only where it moves against "
                             "the knob (inductor's default: fewer evaluations; other edges stay at the grid step)")
    parser.add_argument("--budget", type=byte_budget, action="append", default=[], metavar="BYTES",
                        help="answer for this byte budget (40GiB, bytes or a GPU preset; repeatable): the largest "
                             "knob that fits and whether every smaller knob fits too")
    parser.add_argument("--accounting", choices=tuple(PEAK_ACCOUNTINGS), default="allocated",
                        help="the peak --budget and the holes are read under: flat bytes, or the caching "
                             "allocator's allocated or reserved bytes (default allocated)")
    parser.add_argument("--solver", type=solver_list, default=None, metavar="NAME[,NAME...]",
                        help="activation_memory_budget_solver values, one census each (dp, greedy, ilp, "
                             "dp_knapsack_sliding_hirschberg; default torch's configured one); each census also "
                             "counts the knob values where the solver's choice saves more than its own limit")
    parser.add_argument("--runtime-estimator", type=estimator_list, default=None, metavar="NAME[,NAME...]",
                        help="activation_memory_budget_runtime_estimator values, one census each (flops, "
                             "profile: needs a GPU, testing; default torch's configured one)")
    parser.add_argument("--out", type=output_directory, metavar="DIR",
                        help="write the census's tables (parquet) and its JSON here")
    parser.add_argument("-j", "--jobs", type=jobs_count, default=1,
                        help="evaluate knobs in this many worker processes (-1: all cores; default 1)")
    # dtrlab.sweep.BACKENDS, as `dtrlab sweep --backend` (here --backend names the compile backend)
    parser.add_argument("--executor", choices=("sequential", "fork", "loky", "dask"), default="fork",
                        help="where --jobs evaluate knobs (dtrlab sweep's --backend; here --backend is the compile "
                             "backend): fork (default: processes forked after the model is traced here, sharing "
                             "the traced graph; POSIX), loky (joblib processes) or dask (needs --scheduler): each "
                             "of their workers receives the model source's spec and traces it once; sequential: here")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="evaluate knobs on this Dask scheduler's workers, e.g. tcp://host:8786 (each traces the "
                             "model once)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def add_backend_argument(parser, flag: str) -> None:
    """``--backend``: whose step the peaks are of (dtrlab.memory.partitioned.knob_peaks)."""
    parser.add_argument(flag, dest="compile_backend", choices=("inductor", "aot_eager"), default="inductor",
                        help="the torch.compile backend whose step is accounted: inductor (torch.compile's default: "
                             "Inductor's own lowering of each partition, its fusion, buffer reuse and memory-aware "
                             "reordering; lowered for --device) or aot_eager (the partitioned graphs run node by node); "
                             "default inductor")


def run(args) -> int:
    from ..analysis.knob_census import DEFAULT_PLANS, KnobPlan, census_knob, lowering_answer, read_census, write_census

    defaults = DEFAULT_PLANS[args.compile_backend]
    plan = KnobPlan(**(args.knobs or knob_range(defaults["knobs"])),
                    resolution=args.resolution or defaults["resolution"], refine=args.refine or defaults["refine"])
    if args.source.endswith(".json"):
        censuses = [(lambda: read_census(args.source), "")]
    else:
        execution = knob_execution(args)
        evaluations = model_evaluations(args)
        censuses = [(functools.partial(census_knob, evaluate, plan, name=name, execution=execution), axes)
                    for evaluate, name, axes in evaluations]
    for make, axes in censuses:
        started = time.perf_counter()
        census = make()
        seconds = time.perf_counter() - started
        if axes:
            print(f"\n== {axes}")
        report(census, PEAK_ACCOUNTINGS[args.accounting], args.budget)
        written = write_census(census, args.out) if args.out else []
        backend = census.meta.get("backend", "aot_eager")
        if lowering_answer(census.meta):
            print(f"\n{lowering_answer(census.meta)}")
        print(f"\n{len(census.samples)} knob values ({census.plan.describe()}), {backend} accounting, in "
              f"{seconds:.1f} s" + (f"; wrote {written[-1]} and {len(written) - 1} tables" if written else ""))
    return 0


def knob_execution(args):
    """The :class:`~dtrlab.sweep.execution.Execution` of ``--jobs``, ``--executor``, ``--scheduler`` and
    ``--quiet``; a ``--scheduler`` that does not answer fails now."""
    from ..sweep.execution import Execution
    from .common import check_scheduler

    if args.executor == "dask" and not args.scheduler:
        raise ValueError("--executor dask needs --scheduler ADDRESS, e.g. tcp://127.0.0.1:8786")
    check_scheduler(args.scheduler)
    return Execution(jobs=args.jobs, backend="dask" if args.scheduler else args.executor, client=args.scheduler,
                     progress=not args.quiet)


def model_evaluations(args) -> list[tuple]:
    """(knob -> peaks, the census's name, its axes) per solver and runtime estimator asked for: a
    :class:`~dtrlab.analysis.knob_census.KnobSource` each (the model source is traced once per process, at its
    first knob; torch's partitioner per knob, watched: does the knapsack keep its limit)."""
    try:
        import torch  # noqa: F401 (installed?)
    except ImportError as exc:
        raise ValueError(f"dtrlab knob needs PyTorch ({exc}); install it with `pip install 'dtrlab[torch]'`") \
            from None
    from ..analysis.knob_census import KnobSource
    from ..trace.torch_compile.joint import check_torch_has_knob
    from ..trace.sizes import SIZE_KEYS

    check_torch_has_knob()
    options = {"batch": args.batch, "seq": args.seq, "image": args.image, **precision_options(args),
               **{key: getattr(args, key) for key in SIZE_KEYS}}
    gpu = lowering_gpu(args)
    if gpu is not None:
        options["gpu"] = gpu  # dtrlab.trace.torch_compile.tracing.trace_joint's: the step traced and lowered for it
    source = KnobSource(args.source, tuple(sorted(options.items())), getattr(args, "compile_backend", "inductor"))
    name = census_name(args.source, args)
    solvers, estimators = getattr(args, "solver", None), getattr(args, "runtime_estimator", None)
    if solvers is None and estimators is None:
        return [(source, name, "")]
    return [(dataclasses.replace(source, solver=solver, runtime_estimator=estimator, watched=True),
             name + "".join(f"-{part}" for part in (solver, estimator) if part),
             f"solver {solver or 'configured'}, runtime estimator {estimator or 'configured'}")
            for solver in solvers or (None,) for estimator in estimators or (None,)]


def model_evaluation(args):
    """(knob -> peaks, the census's name) for a model source with torch's configured solver and estimator."""
    evaluate, name, _ = model_evaluations(args)[0]
    return evaluate, name


def census_name(source: str, args) -> str:
    """A file name for the census of ``source`` at these sizes (and the GPU it is lowered for):
    ``hf-llama-layers2-b4-s2048``, ``hf-gpt2-layers1-H100-80GB``."""
    from ..trace.sizes import SIZE_KEYS

    name = "".join(c if c.isalnum() or c in "._" else "-" for c in source).strip("-")
    sizes = [(key.replace("_", ""), getattr(args, key)) for key in SIZE_KEYS]
    precision = [(key, getattr(args, key, None)) for key in ("dtype", "autocast")]
    for flag, value in [*sizes, ("b", args.batch), ("s", args.seq), *precision, ("", lowering_gpu(args))]:
        if value is not None:
            name += f"-{flag}{value}"
    return name


def report(census, accounting: str, budgets: list[int]) -> None:
    summary = census.summary
    print_table(summary.astype(object).where(summary.notna(), None).to_dict("records"))
    regions = census.regions[census.regions.accounting == accounting]
    if len(regions):
        print(f"\nnon-monotone regions ({accounting}): a larger knob gives a lower peak")
        print_table(regions.drop(columns="accounting").to_dict("records"))
    holes = census.holes[census.holes.accounting == accounting]
    if len(holes):
        print(f"\nholes ({accounting}): knobs that do not fit a budget although a smaller and a larger knob do")
        print_table(holes.drop(columns="accounting").astype(object).where(holes.notna(), None).to_dict("records"))
    if "knapsack_over" in census.samples:
        over = census.samples[census.samples.knapsack_over > 0]
        print(f"\nknapsack over its own memory limit (pytorch#197871) at {len(over)} of {len(census.samples)} knob "
              "values" + (f", by up to {census.samples.knapsack_worst.max():.6f}x the limit: knobs "
                          + ", ".join(f"{k:g}" for k in over.knob[:8]) + (" ..." if len(over) > 8 else "")
                          if len(over) else ""))
    for budget in budgets:
        choice = census.knob_for_budget(budget, accounting)
        print(f"\nbudget {budget:,} bytes ({human_bytes(budget)}), {accounting}: " + choice.describe())
