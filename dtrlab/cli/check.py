"""``dtrlab check MODEL|LOG --device A100-80GB --budget 40GiB``: is this budget safe, and what should I pick?

Captures the model when given a model source (as ``dtrlab capture``), censuses a window around the
budget for DTR and the zoo's best alternatives under flat memory and the caching allocator on the
device (dtrlab.analysis.check), prints five lines and writes an HTML report and a JSON record. ``--knob`` adds
torch.compile's activation_memory_budget, ``--ac`` activation-checkpointing plans (dtrlab.trace.checkpointing)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ..trace.sizes import SIZE_KEYS
from .capture import MODELLED_COSTS, add_model_size_arguments
from .common import (byte_count, check_no_limit, execution_argument, jobs_count, load_single_trace, model_source,
                     overhead_limit_or_none, positive_float, positive_size)
from .knob import add_backend_argument, output_directory


def trace_or_model_source(text: str) -> str:
    """A trace file that exists, or a model source checked before torch is imported (:func:`model_source`)."""
    path = Path(text)
    if path.exists():
        return text
    if path.suffix in (".log", ".jsonl", ".gz", ".zip") or "/" in text:
        raise argparse.ArgumentTypeError(f"no trace file {text} (give a log or trace file, or a model source such as "
                                         "resnet32 or hf:gpt2)")
    return model_source(text)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "check", help="one question: is this budget safe for my model on this GPU, and what should I pick? "
                      "(census around the budget, hole anatomy, safe budgets; HTML + JSON report)")
    parser.add_argument("source", metavar="MODEL|LOG", type=trace_or_model_source,
                        help="a trace or log file (.log, .jsonl, .jsonl.gz), or a model source to capture first "
                             "as dtrlab capture does: a zoo name, torchvision:NAME, hf:NAME, diffusers:NAME or "
                             "module:function (needs dtrlab[torch,models])")
    parser.add_argument("--device", required=True, type=positive_size, metavar="GPU",
                        help="the device: a preset such as A100-80GB or H100-80GB, bytes, or a size such as 80GiB")
    parser.add_argument("--budget", required=True, type=positive_size, metavar="BUDGET",
                        help="the DTR budget: bytes, a size such as 40GiB, or a ratio of the unbounded peak such "
                             "as 0.17 or 17%%")
    parser.add_argument("--policies", nargs="+", metavar="POLICY", default=None,
                        help="policies to census (default dtr dtr_eq_class msps; the first is the one the summary "
                             "answers for)")
    parser.add_argument("--window", type=positive_float, default=0.05,
                        help="census this fraction of the peak on either side of the budget (default 0.05)")
    parser.add_argument("--delta", type=positive_float, default=0.002,
                        help="census step, a fraction of the peak: every hole at least this wide in the window is "
                             "found (default 0.002)")
    parser.add_argument("--resolution", type=byte_count, metavar="BYTES",
                        help="bisect hole edges to this many bytes (default: 1 MiB or 1/10000 of the peak)")
    parser.add_argument("--no-monotone", action="store_true", help="do not run monotone(dtr) at the budget")
    parser.add_argument("--knob", nargs="?", const="", default=None, metavar="CENSUS.json",
                        help="add torch.compile's activation_memory_budget: the largest knob that fits the budget and "
                             "whether a smaller one sits in a hole, from a census written by dtrlab knob, or (no "
                             "file, a model source) from a census run now (0..1 every 0.01, edges against the knob "
                             "refined to 0.001; minutes)")
    parser.add_argument("--ac", action="store_true",
                        help="add activation checkpointing: the model's step recorded under torchtitan-style plans "
                             "(none, full, every:N, op) and which fit the budget (flat peak), with their recompute "
                             "(needs a model source)")
    add_backend_argument(parser, "--knob-backend")
    parser.add_argument("--overhead-limit", type=overhead_limit_or_none, default=2.0,
                        help="thrash once total compute exceeds this multiple of the baseline (default 2.0; none: "
                             "no limit)")
    parser.add_argument("--out", default="dtrlab-check", type=output_directory, metavar="DIR",
                        help="write NAME.html, NAME.json and the figure NAME.png here (and a captured model's "
                             "NAME.jsonl.gz); "
                             "default dtrlab-check/")
    add_model_size_arguments(parser)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="capture: cast parameters and floating inputs (default: the model's)")
    parser.add_argument("--cost", choices=MODELLED_COSTS, default="flops", metavar="COST",
                        help=f"capture: cost model, {', '.join(MODELLED_COSTS)} (default flops)")
    parser.add_argument("-j", "--jobs", type=jobs_count, default=1, help="local worker processes (default 1)")
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--cache", metavar="DIR", help="result cache directory (default $DTRLAB_CACHE or ~/.cache/dtrlab)")
    cache.add_argument("--no-cache", action="store_true", help="simulate everything, store nothing")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    capture_options = ("batch", "seq", "image", *SIZE_KEYS, "dtype", "cost")
    parser.set_defaults(handler=run, capture_defaults={key: parser.get_default(key) for key in capture_options})


def run(args) -> int:
    from ..analysis.check import DEFAULT_POLICIES, CheckPlan, check, parse_device
    from ..plots.check import write_check_report
    from ..runtime.semantics import Semantics

    parse_device(args.device)  # a bad device is an error before a capture
    _refuse_capture_options_for_a_trace(args)
    for policy in args.policies or DEFAULT_POLICIES:
        check_no_limit(args.overhead_limit, policy)
    plan = CheckPlan(window=args.window, delta=args.delta, policies=tuple(args.policies or DEFAULT_POLICIES),
                     monotone=not args.no_monotone, resolution=args.resolution)
    out = Path(args.out)
    knob = _knob_census(args)
    ac = _checkpointing_plans(args)
    trace = _trace(args, out)
    report = check(trace, args.budget, args.device, plan=plan, semantics=Semantics(overhead_limit=args.overhead_limit),
                   execution=execution_argument(args), knob=knob, ac=ac)
    name = _file_name(trace.name)
    html_path, json_path = out / f"{name}.html", out / f"{name}.json"
    out.mkdir(parents=True, exist_ok=True)
    write_check_report(report, html_path, json_path, out / f"{name}.png")
    for line in report.summary():
        print(line)
    print(f"report: {html_path} (JSON: {json_path})")
    return 0


def _refuse_capture_options_for_a_trace(args) -> None:
    """The capture's options size a model source; given with a trace file they would be ignored."""
    if not Path(args.source).exists():
        return
    given = [f"--{key.replace('_', '-')}" for key, default in args.capture_defaults.items()
             if getattr(args, key) != default]
    if given:
        raise ValueError(f"{', '.join(given)} size a model source to capture; {args.source} is a trace file, "
                         "recorded already")


def _knob_census(args):
    """The knob census ``--knob`` asks for (None without it): read from a file, or run on the model source."""
    if args.knob is None:
        return None
    from ..analysis.knob_census import KnobPlan, census_knob, read_census
    from ..sweep.execution import Execution
    from .knob import model_evaluation

    if args.knob:
        return read_census(args.knob)
    if Path(args.source).exists():
        raise ValueError(f"--knob without a census file needs a model source, not the trace file {args.source} "
                         "(run dtrlab knob on the model and pass its census JSON)")
    evaluate, name = model_evaluation(args)
    return census_knob(evaluate, KnobPlan(resolution=1e-3, refine="against"), name=name,
                       execution=Execution(jobs=args.jobs, backend="fork", progress=not args.quiet))


def _checkpointing_plans(args):
    """``--ac``: the model's plan table (dtrlab.analysis.checkpointing), None without it."""
    if not args.ac:
        return None
    if Path(args.source).exists():
        raise ValueError(f"--ac needs a model source to record under each checkpointing plan, not the trace file "
                         f"{args.source}")
    import torch

    from ..analysis.checkpointing import plan_table
    from ..trace.checkpointing import capture_plans

    sizes = {key: getattr(args, key) for key in SIZE_KEYS}
    return plan_table(capture_plans(args.source, cost=args.cost, batch=args.batch, seq=args.seq, image=args.image,
                                    dtype=getattr(torch, args.dtype) if args.dtype else None, **sizes))


def _trace(args, out: Path):
    """The trace of ``args.source``: a file is loaded, anything else captured (and kept in ``out``)."""
    path = Path(args.source)
    if path.exists():
        return load_single_trace(str(path))
    try:
        import torch
    except ImportError as exc:
        raise ValueError(f"{args.source} is not a file, and capturing a model needs PyTorch ({exc}); "
                         "pip install 'dtrlab[torch,models]'") from None
    from ..trace import load_log
    from ..trace.capture import capture

    sizes = {key: getattr(args, key) for key in SIZE_KEYS}
    recording = capture(args.source, cost=args.cost, batch=args.batch, seq=args.seq, image=args.image,
                        dtype=getattr(torch, args.dtype) if args.dtype else None, progress=not args.quiet, **sizes)
    batch = recording.meta["batch"]
    written = recording.write(out / f"{_file_name(args.source)}-b{batch}.jsonl.gz")
    return load_log(written)


def _file_name(name: str) -> str:
    """``name`` with every character a file name should not hold replaced by ``-``."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", name).strip("-") or "trace"
