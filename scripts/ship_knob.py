"""Regenerate results/shipped/knob/: the activation-memory knob census of shipped models (notebook 13 reads it).

    python scripts/ship_knob.py                                   # the default models of traces/ and traces/models/
    python scripts/ship_knob.py --sets models --only llama-1b-b4-s2048 -j 2
    python scripts/ship_knob.py --knobs 0:1:0.01 --resolution 1e-4  # the defaults

Each model is built exactly as its trace was captured (the ``command`` in the trace set's
manifest.json: the same source, batch, sequence, image size and dtype), its training step traced
once into the joint graph torch.compile partitions (:func:`dtrlab.trace.partition.trace_joint`),
and :func:`dtrlab.analysis.knob_census.census_knob` calls torch's partitioner at every knob value
(:func:`dtrlab.memory.partitioned.knob_peaks`). Each census is written as
``results/shipped/knob/<trace set>/<trace name>.json`` plus its parquet tables, and the sha256
and size of every file written is recorded in ``results/shipped/MANIFEST.json`` (the other
entries are kept). The census's wall time on this machine is in its JSON (``seconds``).
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrlab.analysis.knob_census import KnobPlan, census_knob, parse_knobs, write_census  # noqa: E402
from dtrlab.integrity import read_json, write_manifest  # noqa: E402
from dtrlab.sweep.execution import Execution  # noqa: E402

SHIPPED = ROOT / "results" / "shipped"
SETS = {"traces": ROOT / "traces", "models": ROOT / "traces" / "models"}
#: The census's corpus: the zoo's small models, and a Llama-shaped decoder, GPT-2, ViT and a diffusion model.
DEFAULT_MODELS = {
    "traces": ["transformer-b4", "unet-b2", "resnet32-b8", "lstm-b16", "densenet45-b4", "treelstm-b4",
               "unroll_gan-b64"],
    "models": ["llama-1b-b4-s2048", "gpt2-b8-s1024", "vit_b_16-b64", "sd-unet-b8"],
}


def capture_options(command: str) -> argparse.Namespace:
    """The options of a manifest's ``dtrlab capture ...`` command, parsed by capture's own parser."""
    from dtrlab.cli.capture import capture_parser

    words = shlex.split(command)
    return capture_parser().parse_args(words[words.index("capture") + 1:])


def model_evaluation(command: str):
    """knob -> peaks for the model a capture command built (traced once)."""
    import torch

    from dtrlab.memory.partitioned import knob_peaks
    from dtrlab.trace.partition import trace_joint
    from dtrlab.trace.sizes import SIZE_KEYS

    options = capture_options(command)
    joint = trace_joint(options.model, batch=options.batch, seq=options.seq, image=options.image,
                        dtype=getattr(torch, options.dtype) if options.dtype else None,
                        **{key: getattr(options, key) for key in SIZE_KEYS})
    return functools.partial(knob_peaks, joint)


def trace_entries(set_name: str) -> dict[str, dict]:
    """The trace set's manifest entries by trace name (the log's name without its suffixes)."""
    return {Path(e["log"]).name.split(".")[0]: e for e in read_json(SETS[set_name] / "manifest.json")["models"]}


def ship(set_name: str, names: list[str], plan: KnobPlan, jobs: int) -> list[Path]:
    entries = trace_entries(set_name)
    written = []
    for name in names:
        started = time.perf_counter()
        print(f"ship_knob: {set_name}/{name}: tracing {entries[name]['command']}", flush=True)
        evaluate = model_evaluation(entries[name]["command"])
        traced = time.perf_counter() - started
        census = census_knob(evaluate, plan, name=name, execution=Execution(jobs=jobs))
        census.meta.update(trace_seconds=round(traced, 1), command=entries[name]["command"])
        written += write_census(census, SHIPPED / "knob" / set_name)
        print(f"ship_knob: {set_name}/{name}: {len(census.samples)} knobs in {census.seconds:.0f} s after "
              f"{traced:.0f} s of tracing", flush=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", choices=tuple(SETS), default=list(SETS))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these traces (names as in the trace set)")
    parser.add_argument("--knobs", default="0:1:0.01", help="START:STOP:STEP or a list (default 0:1:0.01)")
    parser.add_argument("--resolution", type=float, default=1e-4, help="bisection resolution (default 1e-4)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="processes per census (default 1)")
    args = parser.parse_args(argv)
    plan = KnobPlan(**parse_knobs(args.knobs), resolution=args.resolution)
    known = {name for set_name in args.sets for name in trace_entries(set_name)}
    if set(args.only or ()) - known:
        parser.error(f"--only {sorted(set(args.only) - known)}: no such trace in {args.sets}; known: {sorted(known)}")
    written = []
    for set_name in args.sets:
        names = [n for n in args.only if n in trace_entries(set_name)] if args.only else DEFAULT_MODELS[set_name]
        written += ship(set_name, names, plan, args.jobs)
    if written:
        write_manifest(SHIPPED, written)
        print(f"ship_knob: wrote {len(written)} files; {SHIPPED / 'MANIFEST.json'} updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
