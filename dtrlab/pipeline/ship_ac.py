"""``dtrlab ship ac``: every rematerialization system at the same byte budget (notebook 15 reads it).

    dtrlab ship ac                        # the five small models of MODELS (shipped: --relax-time-limit 60 for mlp3)
    dtrlab ship ac --only gpt2-l2 --ratios 0.4:1.0:0.05 --time-limit 5

For each model (a decoder, GPT-2, a ViT, a CNN, two blocks deep or six for the CNN, and three residual MLP
blocks, the one model small enough for the relaxation to bound on a CPU in seconds; recorded on real CPU
tensors with FLOP costs: the kernels the knob census's joint graph (fake CPU tensors) runs too, where the
meta device would run GPT-2's masked attention as the flash kernel, see tests/test_checkpointing.py), into ``results/shipped/ac/models/`` (one
level below the shipped sweeps, whose reader takes ``results/shipped/*/*.parquet``):

* ``<name>.jsonl.gz``: the plain step (the trace DTR, monotone(DTR) and the solvers run on);
* ``<name>-plans.parquet``: every checkpointing plan's peaks and recompute
  (:func:`dtrlab.analysis.checkpointing.plan_table`);
* ``<name>-knob.json`` and its tables: the knob census of the same step (grid ``--knobs``, refined to
  ``--knob-resolution``);
* ``<name>-frontier.parquet`` (:func:`dtrlab.solvers.frontier.store.write_frontier`): the
  solvers' bracket at the budget grid (no bisection; ``--time-limit`` per stage-model solve, 4x per
  relaxation);
* ``<name>-side.parquet``: the side-by-side table (:func:`dtrlab.solvers.side_by_side.side_by_side`).

Every file is written atomically and recorded in ``results/shipped/MANIFEST.json`` after each model.
"""

from __future__ import annotations

import functools
import io
import time
from pathlib import Path

#: name: (source, build options, title). Sizes: activations well above the parameters, few operators.
MODELS = {
    "decoder-l2": ("hf:llama", dict(batch=4, seq=128, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128,
                                    vocab=256), "Llama-style decoder, 2 layers of width 64 (4x128)"),
    "gpt2-l2": ("hf:gpt2", dict(batch=4, seq=128, layers=2, hidden=64, heads=4, vocab=256),
                "GPT-2, 2 layers of width 64 (4x128)"),
    "vit-l2": ("dtrlab.pipeline.ac_models:vit_tiny_l2", dict(batch=16), "ViT (torchvision), 2 blocks of width 64 (16x32px)"),
    "resnet14": ("dtrlab.pipeline.ac_models:resnet_small", dict(batch=16), "CIFAR ResNet-14, 6 blocks (16x32px)"),
    "mlp3": ("dtrlab.pipeline.ac_models:mlp_blocks", dict(batch=256), "3 residual MLP blocks of width 16 (256)"),
}


def _parquet(table, path: Path) -> Path:
    from ..integrity import atomic_write_bytes

    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def ship_one(name: str, directory: Path, ratios: list[float], knobs: str, knob_resolution: float,
             time_limits: tuple[float, float | None]) -> list[Path]:
    """Record, census, solve and compare one model; the files written."""
    from ..analysis.checkpointing import plan_table
    from ..analysis.knob_census import KnobPlan, census_knob, parse_knobs, write_census
    from ..memory.partitioned import knob_peaks
    from ..runtime import budget_for
    from ..solvers.frontier.plan import FrontierPlan
    from ..solvers.frontier.steps import compute_frontier
    from ..solvers.frontier.store import write_frontier
    from ..solvers.side_by_side import side_by_side
    from ..trace import load_log
    from ..trace.checkpointing import capture_plans
    from ..trace.torch_compile.tracing import trace_joint

    source, options, title = MODELS[name]
    started = time.perf_counter()
    recordings = capture_plans(source, real=True, cost="flops", **options)
    directory.mkdir(parents=True, exist_ok=True)
    trace_path = recordings["none"].write(directory / f"{name}.jsonl.gz")
    trace = load_log(trace_path, cache=False)
    plans = plan_table(recordings).assign(model=name, title=title)
    budgets = sorted({budget_for(trace, ratio) for ratio in ratios})
    print(f"dtrlab ship ac: {name}: {len(plans)} plans recorded ({len(trace.operators)} operators)", flush=True)
    frontier = compute_frontier(trace, FrontierPlan(ratios=tuple(ratios), bisect=False, stage_probes=0,
                                                    time_limit_s=time_limits[0], relax_time_limit_s=time_limits[1]),
                                cache=False)
    print(f"dtrlab ship ac: {name}: frontier {frontier.summary()}", flush=True)
    census = census_knob(functools.partial(knob_peaks, trace_joint(source, **options)),
                         KnobPlan(**parse_knobs(knobs), resolution=knob_resolution), name=f"{name}-knob")
    census.meta.update(source=source, title=title)
    table = side_by_side(trace, plans, census, frontier, budgets).assign(model=name, title=title)
    print(f"dtrlab ship ac: {name}: done in {time.perf_counter() - started:.0f} s", flush=True)
    return [trace_path, _parquet(plans, directory / f"{name}-plans.parquet"), *write_census(census, directory),
            write_frontier(frontier, directory / f"{name}-frontier.parquet"),
            _parquet(table, directory / f"{name}-side.parquet")]


def read_shipped(directory: str | Path, manifest_dir: str | Path):
    """``(side-by-side tables, plan tables)`` of every model shipped in ``directory``, one DataFrame each, every
    file checked against ``manifest_dir/MANIFEST.json`` first (an IntegrityError names a damaged one)."""
    import pandas as pd

    from ..integrity import verify_in_manifest

    tables = {"side": [], "plans": []}
    for path in sorted(Path(directory).glob("*-side.parquet")):
        for kind in tables:
            part = path.with_name(path.name.replace("-side.parquet", f"-{kind}.parquet"))
            verify_in_manifest(part, manifest_dir)
            tables[kind].append(pd.read_parquet(part))
    if not tables["side"]:
        raise FileNotFoundError(f"no side-by-side table is shipped in {directory}; write them with `dtrlab ship ac`")
    return pd.concat(tables["side"], ignore_index=True), pd.concat(tables["plans"], ignore_index=True)


def add_arguments(parser) -> None:
    """The options of ``dtrlab ship ac``."""
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"only these models ({', '.join(MODELS)})")
    parser.add_argument("--ratios", default="0.4:1.0:0.05",
                        help="budgets as fractions of the plain step's peak, START:STOP:STEP (default 0.4:1.0:0.05)")
    parser.add_argument("--knobs", default="0:1:0.05", help="knob grid, START:STOP:STEP (default 0:1:0.05)")
    parser.add_argument("--knob-resolution", type=float, default=0.01, help="knob bisection (default 0.01)")
    parser.add_argument("--time-limit", type=float, default=5.0, help="seconds per stage-model solve (default 5)")
    parser.add_argument("--relax-time-limit", type=float, help="seconds per relaxation solve (default 4x --time-limit)")


def selection(args, parser, models) -> tuple:
    """The ``--ratios`` budgets, or a one-line parser error, after checking every ``--only`` name is in ``models``."""
    from ..suggest import did_you_mean
    from ..sweep.budget_sweep import parse_ratios

    for name in args.only or ():
        if name not in models:
            parser.error(f"--only {name!r}: not a model here{did_you_mean(name, models)}; models: {', '.join(models)}")
    try:
        return parse_ratios(args.ratios)
    except ValueError as error:
        parser.error(f"--ratios: {error}")


def run(args, parser) -> int:
    from ..integrity import write_manifest
    from ..sweep.shipped import DEFAULT_SHIPPED_DIR as SHIPPED

    ratios = selection(args, parser, MODELS)
    written = []
    for name in args.only or MODELS:
        written += ship_one(name, SHIPPED / "ac" / "models", ratios, args.knobs, args.knob_resolution,
                            (args.time_limit, args.relax_time_limit))
        write_manifest(SHIPPED, written)
    print(f"dtrlab ship ac: wrote {len(written)} files; {SHIPPED / 'MANIFEST.json'} updated")
    return 0
