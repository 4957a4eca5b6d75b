"""PyTorch's checkpointing planner (sac_milp) run on a CPU and checked (dtrlab.trace.sac_planner,
dtrlab.pipeline.ship_planner): the accelerator stand-in is scoped, a plan is applied for real, and a shipped
row recomputes end to end."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pulp")
pytest.importorskip("pwlf")

from dtrlab import integrity  # noqa: E402
from dtrlab.pipeline.ship_ac import MODELS as SOURCES  # noqa: E402
from dtrlab.pipeline.ship_planner import judged, read_shipped  # noqa: E402
from dtrlab.sweep.shipped import DEFAULT_SHIPPED_DIR  # noqa: E402
from dtrlab.trace.capture import default_loss  # noqa: E402
from dtrlab.trace.models import build  # noqa: E402
from dtrlab.trace.sac_planner import check_budget, datasheet_accelerator, planner_inputs  # noqa: E402

SHIPPED = DEFAULT_SHIPPED_DIR / "ac" / "planner"


def test_the_accelerator_stand_in_lasts_only_the_estimate():
    before = torch.accelerator.is_available()
    with datasheet_accelerator():
        assert torch.accelerator.is_available()
    assert torch.accelerator.is_available() == before


def test_a_gpu_without_a_datasheet_entry_is_refused():
    source, options, _ = SOURCES["mlp3"]
    workload = build(source, device="cpu", **options)
    with pytest.raises(ValueError, match="gpu_type 'H100': not a GPU in torch's datasheet"):
        planner_inputs(workload.module, workload.inputs, default_loss, gpu_type="H100")


@pytest.fixture(scope="module")
def shipped():
    return read_shipped(SHIPPED, DEFAULT_SHIPPED_DIR)


def test_the_shipped_tables_read_through_the_manifest(shipped, tmp_path):
    assert {"decoder-l2", "gpt2-l2", "mlp3"} <= set(shipped.model)
    assert shipped.solved.any() and (~shipped.solved).any()  # the budget range reaches the planner's limit
    copy = tmp_path / "mlp3-planner.parquet"
    copy.write_bytes((SHIPPED / "mlp3-planner.parquet").read_bytes())
    integrity.write_manifest(tmp_path, [copy])
    assert len(read_shipped(tmp_path, tmp_path)) == (shipped.model == "mlp3").sum()
    copy.write_bytes(copy.read_bytes()[:-10])
    with pytest.raises(integrity.IntegrityError):
        read_shipped(tmp_path, tmp_path)


def test_a_shipped_row_recomputes_end_to_end(shipped):
    """mlp3's first budget where sac_milp checkpoints: the estimators, the planner, the plan applied to the real
    step, its recording and its real CPU peak, again; the plan lowers the real peak below the plain step's."""
    rows = shipped[(shipped.model == "mlp3") & shipped.measured & (shipped.plan != "{}")]
    row = rows.iloc[0]
    source, options, _ = SOURCES["mlp3"]
    workload = build(source, device="cpu", **options)
    inputs = planner_inputs(workload.module, workload.inputs, default_loss, row.gpu_type)
    again = check_budget(workload, inputs, int(row.budget))
    assert again["plan"] == json.loads(row.plan)
    assert (again["planner_peak"], again["trace_peak"], again["real_peak"]) == (
        row.planner_peak, row.trace_peak, row.real_peak)
    plain = shipped[(shipped.model == "mlp3") & (shipped.plan == "{}") & shipped.measured].real_peak.min()
    assert again["real_peak"] < plain


JUDGED = ["measured", "real_total", "exceeded", "fits", "plain_flops", "recompute_flops", "rises", "hole"]


def test_holes_and_exceeded_plans_are_judged_from_the_measurements():
    """Budgets 100..400: unsolved, fits, exceeds its bound after a fit (a hole), fits again."""
    import pandas as pd

    table = judged(pd.DataFrame({"budget": [100, 200, 300, 400], "planner_peak": [-1, 200, 300, 400],
                                 "real_peak": [None, 150, 290, 280], "live_before": [None, 10, 20, 20],
                                 "flops": [None, 7, 6, 5]}), plain_flops=5)
    assert list(table.measured) == [False, True, True, True]
    assert list(table.fits) == [False, True, False, True] and list(table.exceeded) == [False, False, True, False]
    assert list(table.hole) == [False, False, True, False] and list(table.rises) == [False, False, True, True]
    assert list(table.recompute_flops.iloc[1:]) == [2, 1, 0]


def test_the_shipped_judgements_recompute(shipped):
    for _, table in shipped.groupby("model"):
        table = table.reset_index(drop=True)
        again = judged(table.drop(columns=JUDGED), int(table.plain_flops.iloc[0]))
        pd_testing = pytest.importorskip("pandas.testing")
        pd_testing.assert_frame_equal(again[JUDGED], table[JUDGED], check_dtype=False)


@pytest.mark.parametrize("argv, message", [
    (["--only", "mlp4"], "--only 'mlp4': not a model here (did you mean 'mlp3'?)"),
    (["--only", "mlp3", "--gpu-type", "H100"], "--gpu-type: gpu_type 'H100': not a GPU in torch's datasheet"),
])
def test_ship_planner_refuses_bad_options(argv, message, capsys, monkeypatch, tmp_path):
    import dtrlab.pipeline.ship_planner as ship_planner
    from dtrlab.cli import main

    written = []
    monkeypatch.setattr(ship_planner, "judged", lambda *args: written.append(args))
    assert main(["ship", "planner", *argv]) == 2
    assert message in capsys.readouterr().err and not written
