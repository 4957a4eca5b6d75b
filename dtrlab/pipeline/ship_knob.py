"""``dtrlab ship knob``: the activation-memory knob censuses of ``results/shipped/knob/`` (notebook 13 reads them).

    dtrlab ship knob                                       # the zoo (traces/) and the modern corpus (models)
    dtrlab ship knob --sets models --only llama-1b-l2-b4-s2048 -j 2
    dtrlab ship knob --knobs 0:1:0.01 --resolution 1e-4    # the defaults (aot_eager)
    dtrlab ship knob --sets models --only llama-tiny-l2-b2-s64 --interventions 0.05
    dtrlab ship knob --sets models --backend inductor        # its default plan: 0:1:0.1, against, 0.025

Each model is a ``dtrlab capture`` command (the zoo's as traces/manifest.json records them; the
modern corpus two blocks deep, see MODELS). Its training step is traced once into the joint graph
torch.compile partitions (:func:`dtrlab.trace.torch_compile.tracing.trace_joint`), and
:func:`dtrlab.analysis.knob_census.census_knob` calls torch's partitioner at every knob value
(:func:`dtrlab.memory.partitioned.knob_peaks`). Each census is written as
``results/shipped/knob/<set>/<name>.json`` plus its parquet tables, beside the DTR trace of the same
step (``<name>.jsonl.gz``: ``dtrlab capture`` with FLOP costs, the knob's recompute unit), and the
sha256 and size of every file written are recorded in ``results/shipped/MANIFEST.json`` (the other
entries are kept). The census's wall time on this machine is in its JSON (``seconds``). The shipped
corpus was computed with ``--resolution 1e-3`` (``--refine against`` but for the Llama decoder).

``--backend`` names whose step is accounted (:func:`dtrlab.memory.partitioned.knob_peaks`): ``aot_eager``
(the default here: the full-resolution censuses above) or ``inductor`` (Inductor's lowering of each distinct
partition, dtrlab.trace.torch_compile.inductor; seconds per partition, so on a coarser plan). An Inductor census is
written to ``results/shipped/knob/<set>/inductor/<name>.json``, beside the aot_eager one of the same name (its DTR
trace is the aot_eager folder's); notebook 13 draws the two side by side. The shipped Inductor censuses are
on its own default plan (:data:`dtrlab.analysis.knob_census.DEFAULT_PLANS`; docs/results.md says which models).
``--device H100-80GB`` (Inductor only) lowers for that GPU instead, on fake tensors
(dtrlab.trace.torch_compile.cuda_joint), into ``knob/<set>/inductor-H100-80GB/``; notebook 13 draws it beside the
CPU's lowering.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import time
from pathlib import Path

from ..analysis.knob_census import (DEFAULT_PLANS, REFINE_MODES, KnobPlan, census_knob, note_lowering, parse_knobs,
                                    write_census)
from ..integrity import read_json, write_manifest
from ..sweep.execution import Execution
from ..sweep.shipped import DEFAULT_SHIPPED_DIR as SHIPPED
from ..trace.sizes import SIZE_KEYS
from .figures import ROOT
#: Two of the zoo's small models exactly as traces/ captured them (their manifest's commands).
ZOO = ["transformer-b4", "unet-b2"]
#: The modern corpus (name: capture command, title), traces/models/' models at their batch and sequence in
#: float32 (trace_joint cannot yet cast a fake model to bfloat16): at full depth (``-f32-``; torchvision's ViT
#: does not build on fake tensors: its truncated-normal initialiser loops on data), and two blocks
#: deep (``-l2-``; ViT and DiT from dtrlab.pipeline.knob_models), and the tiny Llama-style decoder on which
#: the capture reproduces pytorch/pytorch#197838's shape (docs/compile.md).
MODELS = {
    "llama-1b-f32-b4-s2048": ("dtrlab capture hf:llama --batch 4 --seq 2048",
                              "Llama 3.2 1B-shaped decoder, 16 layers (4x2048)"),
    "gpt2-f32-b8-s1024": ("dtrlab capture hf:gpt2 --batch 8 --seq 1024", "GPT-2 small, 12 layers (8x1024)"),
    "llama-1b-l2-b4-s2048": ("dtrlab capture hf:llama --layers 2 --batch 4 --seq 2048",
                             "Llama 3.2 1B-shaped decoder, 2 layers (4x2048)"),
    "gpt2-l2-b8-s1024": ("dtrlab capture hf:gpt2 --layers 2 --batch 8 --seq 1024", "GPT-2 small, 2 layers (8x1024)"),
    "vit_b_16-l2-b64": ("dtrlab capture dtrlab.pipeline.knob_models:vit_b_16_blocks --batch 64", "ViT-B/16, 2 blocks (64)"),
    "dit-xl-2-l2-b32": ("dtrlab capture dtrlab.pipeline.knob_models:dit_xl_2_blocks --batch 32", "DiT-XL/2, 2 blocks (32)"),
    "llama-tiny-l2-b2-s64": ("dtrlab capture hf:llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --intermediate 128 "
                             "--vocab 256 --batch 2 --seq 64", "Tiny Llama-style decoder (2x64), #197838's shape"),
}


#: Notebook 14's census at its default parameters: its model (``source``, ``build_options``) as a capture command,
#: and its plan (``knobs``; the resolution and refinement it fixes). The notebook reads it instead of computing
#: it when its joint graph, torch and plan are this census's (knob_census.shipped_census_for); a test holds the
#: notebook's defaults to these.
NOTEBOOKS = {"14-fit-budget": ("dtrlab capture hf:llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 "
                               "--intermediate 512 --vocab 1024 --batch 4 --seq 256",
                               "Notebook 14's default model: a 2-layer Llama-style decoder (4x256)")}
NOTEBOOK_PLAN = {"knobs": "0:1:0.02", "resolution": 0.01, "refine": "against"}


def census_directory(set_name: str, backend: str, gpu: str | None = None) -> Path:
    """Where a trace set's censuses under ``backend`` are shipped: aot_eager's in ``knob/<set>/``, beside the DTR
    traces of the same steps; Inductor's in ``knob/<set>/inductor/``, or ``knob/<set>/inductor-<gpu>/`` when lowered
    for GPU ``gpu``."""
    directory = SHIPPED / "knob" / set_name
    if backend != "inductor":
        return directory
    return directory / ("inductor" if gpu is None else f"inductor-{gpu}")


def corpus(set_name: str) -> dict[str, tuple[str, str]]:
    """Trace name -> (the ``dtrlab capture`` command that builds it, its title), for a trace set."""
    if set_name == "models":
        return dict(MODELS)
    if set_name == "notebooks":
        return dict(NOTEBOOKS)
    entries = {Path(e["log"]).name.split(".")[0]: (e["command"], e["title"])
               for e in read_json(ROOT / "traces" / "manifest.json")["models"]}
    return {name: entries[name] for name in ZOO}


def capture_options(command: str) -> argparse.Namespace:
    """The model and the build options of a ``dtrlab capture ...`` command (its cost and output aside)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("model")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--dtype")
    for key in SIZE_KEYS:
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=int)
    words = shlex.split(command)
    return parser.parse_known_args(words[words.index("capture") + 1:])[0]


def build_options(command: str) -> dict:
    import torch

    options = capture_options(command)
    return {"batch": options.batch, "seq": options.seq, "image": options.image,
            "dtype": getattr(torch, options.dtype) if options.dtype else None,
            **{key: getattr(options, key) for key in SIZE_KEYS}}


def ship_one(set_name: str, name: str, command: str, title: str, plan: KnobPlan, jobs: int,
             backend: str = "aot_eager", gpu: str | None = None) -> list[Path]:
    """Census one model under ``backend`` (lowered for GPU ``gpu``, else the CPU) and write it; under aot_eager with
    the DTR trace of the same step (``dtrlab capture``, FLOP costs)."""
    import torch

    from ..memory.partitioned import knob_peaks
    from ..trace.capture import capture
    from ..trace.torch_compile.joint import joint_hash
    from ..trace.torch_compile.tracing import trace_joint

    source, options = capture_options(command).model, build_options(command)
    directory = census_directory(set_name, backend, gpu)
    started = time.perf_counter()
    joint = trace_joint(source, backend=backend, gpu=gpu, **options)
    traced = time.perf_counter() - started
    print(f"dtrlab ship knob: {set_name}/{name} ({backend}): traced {source} ({joint.node_count} joint-graph nodes) "
          f"in {traced:.0f} s", flush=True)
    census = census_knob(functools.partial(knob_peaks, joint), plan, name=name,
                         execution=Execution(jobs=jobs, backend="fork"))  # the traced joint inherited, not pickled
    census.meta.update(trace_seconds=round(traced, 1), command=command, title=title, desc=joint.desc,
                       nodes=joint.node_count, graph_hash=joint_hash(joint), torch_version=torch.__version__)
    if backend == "inductor":
        note_lowering(census.meta, gpu or "cpu")
    print(f"dtrlab ship knob: {set_name}/{name} ({backend}): {len(census.samples)} knobs in {census.seconds:.0f} s"
          + (f", {sum(len(part.lowerings) for part in joint.parts or (joint,))} distinct partitions lowered here"
             if backend == "inductor" else ""), flush=True)
    written = write_census(census, directory)
    if backend == "inductor" or set_name == "notebooks":  # a notebook's census: no DTR trace beside it
        return written
    return [capture(source, cost="flops", **options).write(directory / f"{name}.jsonl.gz"), *written]


def ship_interventions(set_name: str, name: str, command: str, knob: float) -> Path:
    """Single-node interventions at one knob (:func:`dtrlab.memory.partitioned.interventions`: every node the
    partitioner recomputed forced saved, every saved one forced recomputed), as
    ``<name>-interventions-<knob>.parquet`` beside the census."""
    import io

    import pandas as pd

    from ..integrity import atomic_write_bytes
    from ..memory.partitioned import interventions
    from ..trace.torch_compile.tracing import trace_joint

    started = time.perf_counter()
    joint = trace_joint(capture_options(command).model, **build_options(command))
    table = pd.DataFrame(interventions(joint, knob)).assign(knob=knob)
    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    path = SHIPPED / "knob" / set_name / f"{name}-interventions-{knob:g}.parquet"
    atomic_write_bytes(path, buffer.getvalue())
    print(f"dtrlab ship knob: {set_name}/{name}: {len(table)} interventions at knob {knob:g} in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    return path


def notebook_plan() -> KnobPlan:
    """Notebook 14's census plan (:data:`NOTEBOOK_PLAN`)."""
    return KnobPlan(**parse_knobs(NOTEBOOK_PLAN["knobs"]), resolution=NOTEBOOK_PLAN["resolution"],
                    refine=NOTEBOOK_PLAN["refine"])


def add_arguments(parser) -> None:
    """The options of ``dtrlab ship knob``."""
    parser.add_argument("--sets", nargs="+", choices=("traces", "models", "notebooks"), default=["traces", "models"],
                        help="the zoo (traces), the modern corpus (models), or notebook 14's default model on its own "
                             "plan (notebooks; --knobs, --resolution and --refine do not apply)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these models (names as in the corpus)")
    parser.add_argument("--knobs", help="START:STOP:STEP or a list (default 0:1:0.01; inductor: 0:1:0.1)")
    parser.add_argument("--resolution", type=float, help="bisection resolution (default 1e-4; inductor: 0.025)")
    parser.add_argument("--refine", choices=REFINE_MODES,
                        help="bisect every change (default) or only those against the knob (inductor's default)")
    parser.add_argument("--interventions", type=float, metavar="KNOB",
                        help="instead of censuses: the single-node interventions at this knob of each --only model")
    parser.add_argument("--backend", choices=tuple(DEFAULT_PLANS), default="aot_eager",
                        help="whose step is accounted: aot_eager (default; knob/<set>/) or inductor "
                             "(knob/<set>/inductor/)")
    parser.add_argument("--device", metavar="GPU",
                        help="inductor only: lower for this GPU (H100-80GB, ...: CUDA Inductor on fake tensors) into "
                             "knob/<set>/inductor-GPU/ (default: the CPU's lowering)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="processes per census (default 1)")


def run(args, parser) -> int:
    given = {key: getattr(args, key) for key in DEFAULT_PLANS[args.backend] if getattr(args, key) is not None}
    options = {**DEFAULT_PLANS[args.backend], **given}
    try:
        plan = KnobPlan(**parse_knobs(options["knobs"]), resolution=options["resolution"], refine=options["refine"])
    except ValueError as exc:
        parser.error(str(exc))
    known = {name for set_name in args.sets for name in corpus(set_name)}
    if set(args.only or ()) - known:
        parser.error(f"--only {sorted(set(args.only) - known)}: not in {args.sets}; known: {sorted(known)}")
    if args.interventions is not None and args.backend != "aot_eager":
        parser.error("--interventions: the single-node interventions are aot_eager's only (--backend aot_eager)")
    if args.device is not None and (args.backend != "inductor" or "notebooks" in args.sets):
        parser.error("--device: a GPU lowering is Inductor's, for the traces and models sets (--backend inductor)")
    if args.device is not None:
        from ..trace.torch_compile.gpu_target import gpu_target_named

        try:
            gpu_target_named(args.device)
        except ValueError as exc:
            parser.error(f"--device: {exc}")
    written = []
    for set_name in args.sets:
        for name, (command, title) in corpus(set_name).items():
            if args.interventions is not None and name in (args.only or ()):
                written.append(ship_interventions(set_name, name, command, args.interventions))
            elif args.interventions is None and (not args.only or name in args.only):
                written += ship_one(set_name, name, command, title, notebook_plan() if set_name == "notebooks" else plan,
                                    args.jobs, args.backend, args.device)
            else:
                continue
            write_manifest(SHIPPED, written)  # after each model: a later failure keeps the earlier ones
    print(f"dtrlab ship knob: wrote {len(written)} files; {SHIPPED / 'MANIFEST.json'} updated")
    return 0
