"""``dtrlab ship planner``: PyTorch's checkpointing planner (``sac_milp``) checked on real CPU steps.

    dtrlab ship planner                         # the models of MODELS, budgets 0.3:1.05:0.05 of the planner's baseline
    dtrlab ship planner --only mlp3 --ratios 0.5:1.0:0.1

For each model (:data:`dtrlab.pipeline.ship_ac.MODELS`, built on real CPU tensors) and each budget, a
fraction of the planner's own peak without checkpointing (``ilp_utils.get_peak_memory_runtime_baseline``),
one row (:func:`dtrlab.trace.sac_planner.check_budget`, see that module for how torch's estimators run on a
CPU): the plan ``sac_milp`` picks, its peak bound, the step's real CPU peak under the plan and the recorded
trace's predicted peak. Columns added here:

* ``real_total``: the real peak plus the bytes live before the step (parameters, inputs), the quantity the
  planner's budget bounds (its memory includes parameters and gradients);
* ``exceeded``: a solved plan whose ``real_total`` is above the planner's own peak bound;
* ``fits``: ``real_total`` within the budget;
* ``rises``: the real peak is above that of a smaller budget's plan (the issue's question; a planner spends
  more memory when given more, so this alone is expected);
* ``hole``: the plan does not fit while a smaller budget's plan did (more memory, and it fails);
* ``recompute_flops``: the plan's FLOPs minus the plain step's (capture's FLOP model).

Written to ``results/shipped/ac/planner/<name>-planner.parquet`` (atomic) and recorded in the MANIFEST.
"""

from __future__ import annotations

import json
from pathlib import Path

#: the models of ship_ac.MODELS the planner runs on. Left out: vit-l2, where torch's SACEstimator divides by a
#: module's zero SAC memory fitting its trade-off curve (sac_estimator.py:593, ZeroDivisionError).
MODELS = ("decoder-l2", "gpt2-l2", "resnet14", "mlp3")
#: check_budget's columns a row has only when its plan ran (all absent when none did)
MEASURED = ("checkpointed", "unmatched_ops", "unmatched", "live_before", "trace_peak", "real_peak", "flops", "error")
#: the datasheet GPU whose roofline times the operators (torch/utils/_runtime_estimation.py)
GPU_TYPE = "NVIDIA H100"


def planner_table(name: str, ratios: list[float], gpu_type: str = GPU_TYPE):
    """The planner's check on ``name`` (a key of ship_ac.MODELS) at each budget ratio, one DataFrame."""
    import pandas as pd

    from ..trace.capture import default_loss
    from ..trace.models import build
    from ..trace.sac_planner import baseline, check_budget, planner_inputs
    from .ship_ac import MODELS as SOURCES

    source, options, title = SOURCES[name]
    workload = build(source, device="cpu", **options)
    inputs = planner_inputs(workload.module, workload.inputs, workload.loss_fn or default_loss, gpu_type)
    base_peak, base_ms = baseline(inputs)
    plain = check_budget(workload, inputs, 4 * base_peak)  # budget well above: no checkpointing
    rows = [{"ratio": ratio, **check_budget(workload, inputs, int(ratio * base_peak))} for ratio in ratios]
    table = pd.DataFrame(rows).sort_values("budget", kind="stable").reset_index(drop=True)
    table = table.reindex(columns=[*table.columns, *(c for c in MEASURED if c not in table.columns)])
    table["plan"] = table.plan.map(lambda plan: json.dumps(plan, sort_keys=True))
    for column in ("checkpointed", "unmatched"):
        table[column] = table[column].map(lambda names: json.dumps(list(names) if isinstance(names, list) else []))
    return judged(table, int(plain["flops"])).assign(model=name, title=title, gpu_type=gpu_type,
                                                      baseline_peak=int(base_peak), baseline_ms=float(base_ms))


def judged(table, plain_flops: int):
    """``table`` (check_budget's rows, sorted by budget) with the columns of the module doc added."""
    table = table.copy()
    table["measured"] = table.real_peak.notna()
    table["real_total"] = table.real_peak + table.live_before
    table["exceeded"] = table.measured & (table.real_total > table.planner_peak)
    table["fits"] = table.measured & (table.real_total <= table.budget)
    table["plain_flops"] = plain_flops
    table["recompute_flops"] = table.flops - plain_flops
    real = table.real_peak.where(table.measured)
    table["rises"] = real > real.cummin().shift(1)
    table["hole"] = table.measured & ~table.fits & table.fits.cummax().shift(1, fill_value=False)
    return table


def read_shipped(directory: str | Path, manifest_dir: str | Path):
    """Every shipped planner table in ``directory``, one DataFrame, each file checked against
    ``manifest_dir/MANIFEST.json`` first (an IntegrityError names a damaged one)."""
    import pandas as pd

    from ..integrity import verify_in_manifest

    paths = sorted(Path(directory).glob("*-planner.parquet"))
    if not paths:
        raise FileNotFoundError(f"no planner table is shipped in {directory}; write them with `dtrlab ship planner`")
    for path in paths:
        verify_in_manifest(path, manifest_dir)
    return pd.concat([pd.read_parquet(path) for path in paths], ignore_index=True)


def add_arguments(parser) -> None:
    """The options of ``dtrlab ship planner``."""
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"only these models ({', '.join(MODELS)})")
    parser.add_argument("--ratios", default="0.3:1.05:0.05",
                        help="budgets as fractions of the planner's peak without checkpointing, START:STOP:STEP "
                             "(default 0.3:1.05:0.05)")
    parser.add_argument("--gpu-type", default=GPU_TYPE, help=f"datasheet GPU of the roofline (default {GPU_TYPE!r})")


def run(args, parser) -> int:
    from ..integrity import write_manifest
    from ..sweep.shipped import DEFAULT_SHIPPED_DIR as SHIPPED
    from .ship_ac import _parquet, selection

    ratios = selection(args, parser, MODELS)
    written, directory = [], SHIPPED / "ac" / "planner"
    directory.mkdir(parents=True, exist_ok=True)
    for name in args.only or MODELS:
        try:
            table = planner_table(name, ratios, args.gpu_type)
        except ValueError as error:
            parser.error(f"--gpu-type: {error}")
        written.append(_parquet(table, directory / f"{name}-planner.parquet"))
        write_manifest(SHIPPED, written)
        print(f"dtrlab ship planner: {name}: {int(table.solved.sum())} of {len(table)} budgets solved, "
              f"{int(table.exceeded.sum())} exceeded, {int(table.hole.sum())} holes", flush=True)
    print(f"dtrlab ship planner: wrote {len(written)} files; {SHIPPED / 'MANIFEST.json'} updated")
    return 0
