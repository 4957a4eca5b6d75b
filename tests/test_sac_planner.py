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
from dtrlab.pipeline.ship_planner import planner_table, read_shipped  # noqa: E402
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
    with pytest.raises(ValueError, match="gpu_type 'H100'"):
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


def test_the_columns_follow_the_measurements():
    table = planner_table("mlp3", [0.5, 0.6, 1.0])
    measured = table[table.measured]
    assert (measured.real_total == measured.real_peak + measured.live_before).all()
    assert (table.exceeded == (table.measured & (table.real_total > table.planner_peak))).all()
    assert not table.solved.iloc[0] and table.solved.iloc[1:].all()
