"""Real execution (dtrlab.execute): the simulator's decisions carried out on real tensors.

Every run is compared with ``dtrlab.simulate`` on the captured trace of the same step (the
compiled core where it applies, an independent code path from the lockstep Python simulator):
status, clock, recompute, peak memory, the evicted storages in order and the failure record.
Passing runs must give the loss and every gradient of a plain eager step, bit for bit.
"""

from __future__ import annotations

import dataclasses

import pytest
from dtrlab.runtime.semantics import Semantics
from dtrlab.sweep.execution import Execution

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from dtrlab.analysis.holes import find_holes  # noqa: E402
from dtrlab.execute import (BudgetBelowMinimum, Divergence, UnsupportedOperator, capture_step,  # noqa: E402
                            minimum_budget, reference_step, run_step)
from dtrlab.runtime import simulate  # noqa: E402
from dtrlab.sweep import sweep  # noqa: E402

COMPARED = ("status", "budget_bytes", "clock", "model_compute", "remat_compute", "peak_memory", "evictions", "remats",
            "evicted_storages", "failure")


class _Block(nn.Module):
    """Views, in-place writes, random and multi-output operators in one small block."""

    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)  # native_layer_norm: three outputs

    def forward(self, x):
        h = self.up(x).relu_()  # in place on a fresh activation
        left, right = h.chunk(2, dim=1)  # a multi-output view operator
        peak, _ = left.max(dim=1, keepdim=True)  # two fresh outputs (values, indices)
        mixed = right.t().contiguous().t() * (left - peak)  # views, a copy
        mixed = F.dropout(mixed, 0.25, training=True)  # random: replayed from its generator state
        out = self.norm(self.down(mixed))
        out.mul_(0.5).add_(x)  # two in-place writes in a row
        return out.view(out.shape[0], 2, -1).sum(1).repeat(1, 2)  # views again


class MixedModel(nn.Module):
    def __init__(self, width: int = 16, depth: int = 4):
        super().__init__()
        self.blocks = nn.Sequential(*[_Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        return self.head(self.blocks(x))


def mixed_model(batch: int = 64):
    """A user source (``test_execute:mixed_model``)."""
    x = torch.randn(batch, 16)
    labels = torch.randint(0, 3, (batch,))
    return MixedModel(), x, lambda logits: F.cross_entropy(logits, labels)


class _ExplicitGenerator(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, x):
        noise = torch.rand(x.shape, generator=self.generator)
        return self.linear(x * noise)


def explicit_generator_model(batch: int = 2):
    """A user source whose forward draws from its own torch.Generator."""
    return _ExplicitGenerator(), torch.randn(batch, 4), None


class _WriteThroughView(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = self.a(x)
        h[:, :8].mul_(2)  # an in-place write through a view: simrd's trace gives it a storage of its own
        y = self.b(torch.tanh(h))  # the program reads the written values through the base
        return self.c(torch.relu(y) + h)


def write_through_view_model(batch: int = 64):
    """A user source whose forward writes in place through a view and reads the base afterwards."""
    return _WriteThroughView(), torch.randn(batch, 16), None


MIXED = "test_execute:mixed_model"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny operators on a shared machine: intra-op threads only wait for each other (10x slower).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def mixed():
    return capture_step(MIXED)


@pytest.fixture(scope="module")
def mixed_reference():
    return reference_step(MIXED)


def assert_same_decisions(executed, trace, policy, budget):
    simulated = simulate(trace, policy, budget_bytes=budget)
    if executed.run.ratio is not None:  # run with a ratio: the same budget
        simulated = dataclasses.replace(simulated, ratio=executed.run.ratio)
    for name in COMPARED:  # named first, for a readable failure
        assert getattr(executed.run, name) == getattr(simulated, name), name
    assert executed.run == simulated  # and every other field of the record
    return simulated


def assert_bit_identical(executed, reference):
    assert torch.equal(executed.loss, reference.loss)
    assert executed.gradients.keys() == reference.gradients.keys() and reference.gradients
    for name, gradient in reference.gradients.items():
        assert torch.equal(executed.gradients[name], gradient), name
    assert executed.parameters.keys() == reference.parameters.keys()
    for name, parameter in reference.parameters.items():  # the optimizer's update, if the step has one
        assert torch.equal(executed.parameters[name], parameter), name


def test_mixed_model_has_what_it_claims(mixed):
    lines = mixed.lines
    assert any(line["INSTRUCTION"] == "MUTATE" for line in lines)  # in-place writes
    calls = [line for line in lines if line["INSTRUCTION"] == "CALL"]
    assert any(len(line["RESULT"]) >= 3 for line in calls)  # layer norm's three outputs
    assert any(line["NAME"] == "split" and len(line["RESULT"]) == 2 for line in calls)  # chunk: two views
    aliases = [line for line in lines if line["INSTRUCTION"] == "ALIAS" and line["ALIAS"] != "-1"]
    assert len(aliases) > 10
    assert any(line["NAME"] in ("bernoulli_", "native_dropout") for line in lines if "NAME" in line)


@pytest.mark.parametrize("policy", ["dtr", pytest.param("msps", marks=pytest.mark.slow),
                                    pytest.param("lru", marks=pytest.mark.slow)])
def test_decisions_and_values_on_a_model_with_views_in_place_and_multi_output_ops(mixed, mixed_reference, policy):
    trace = mixed.trace
    floor = minimum_budget(trace).bytes
    peak = simulate(trace, policy, ratio=1.0).baseline_memory
    statuses, recomputed = set(), 0
    for budget in sorted({floor, (floor + peak) // 2, floor + (peak - floor) // 4, peak}):
        executed = run_step(mixed, budget_bytes=budget, policy=policy)
        assert_same_decisions(executed, trace, policy, budget)
        statuses.add(executed.status)
        recomputed += len(executed.recomputations)
        if executed.passed:
            assert_bit_identical(executed, mixed_reference)
    assert "pass" in statuses and recomputed > 0  # the budgets made it evict and recompute for real


@pytest.mark.parametrize("memory", [dict(memory="caching"), dict(memory="aligned", enforce="allocated")])
def test_decisions_under_a_memory_model(mixed, memory):
    for ratio in (0.6, 0.9):
        executed = run_step(mixed, ratio=ratio, semantics=Semantics(**memory))
        assert executed.run == simulate(mixed.trace, "dtr", ratio=ratio,
                                        semantics=Semantics(**memory))  # the model's metrics too


def test_real_storages_are_dropped_and_restored(mixed, mixed_reference):
    # The smallest passing ratio on a coarse grid: many evictions, every one carried out.
    ratio = next(r / 50 for r in range(10, 51) if simulate(mixed.trace, "dtr", ratio=r / 50).passed)
    executed = run_step(mixed, ratio=ratio)
    assert executed.passed and executed.run.evictions > 0
    real = executed.recomputations
    # Views need no real work, so fewer real recomputations than the simulator's, each with fresh bytes.
    assert 0 < len(real) <= executed.run.remats
    assert sum(r.cost for r in real) <= executed.run.remat_compute
    operators = mixed.trace.operators
    assert all(any(a == -1 and size for a, size in zip(operators[r.operator].aliases, operators[r.operator].sizes))
               for r in real)
    # The real storages kept resident never exceed what the simulator accounts, step by step.
    timeline = executed.memory_timeline
    assert len(timeline) == sum(not op.is_constant for op in operators)
    assert all(real <= simulated for simulated, real in timeline)
    assert max(simulated for simulated, _ in timeline) <= executed.run.peak_memory  # peaks can fall mid-operator
    assert all(r.wall_ns > 0 for r in executed.recomputations)
    assert_bit_identical(executed, mixed_reference)


def test_quick_zoo_model_near_its_threshold():
    captured = capture_step("lstm", batch=2)
    executed = run_step(captured, ratio=0.97)  # passes just above the feasibility threshold (0.96)
    assert_same_decisions(executed, captured.trace, "dtr", executed.run.budget_bytes)
    assert executed.passed and executed.run.evictions > 10
    assert_bit_identical(executed, reference_step("lstm", batch=2))


def test_a_write_through_a_view_is_exact_or_refused():
    source = "test_execute:write_through_view_model"
    captured, reference = capture_step(source), reference_step(source)
    passed = 0
    for ratio in (0.7, 0.8, 0.9, 1.0):  # oom, oom, pass with recomputations, pass
        try:
            executed = run_step(captured, ratio=ratio)
        except UnsupportedOperator as exc:
            assert "through another alias" in str(exc)
            continue
        assert_same_decisions(executed, captured.trace, "dtr", executed.run.budget_bytes)
        if executed.passed:
            assert_bit_identical(executed, reference)
            passed += 1
    assert passed  # at 1.0 at least; never a silently wrong value at any budget


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_step_with_an_optimizer_update(optimizer):
    captured = capture_step(MIXED, optimizer=optimizer)
    reference = reference_step(MIXED, optimizer=optimizer)
    assert sum(line["INSTRUCTION"] == "MUTATE" for line in captured.lines) > \
        sum(line["INSTRUCTION"] == "MUTATE" for line in capture_step(MIXED).lines)  # the update's writes
    initial = reference_step(MIXED).parameters  # without an update: the parameters as built
    assert not all(torch.equal(initial[name], p) for name, p in reference.parameters.items())
    for ratio in (0.6, 0.8, 1.0):
        executed = run_step(captured, ratio=ratio)
        assert_same_decisions(executed, captured.trace, "dtr", executed.run.budget_bytes)
        if executed.passed:
            assert_bit_identical(executed, reference)
    assert executed.passed


def test_budget_below_the_minimum_is_a_clear_error(mixed):
    floor = minimum_budget(mixed.trace)
    with pytest.raises(BudgetBelowMinimum, match=rf"below the step's minimum of {floor.bytes} B \(operator "
                                                 rf"{floor.operator}, {floor.name}"):
        run_step(mixed, budget_bytes=floor.bytes - 1)
    # The bound is sound: the simulator cannot pass just below it either.
    assert not simulate(mixed.trace, "dtr", budget_bytes=floor.bytes - 1).passed


def test_unsupported_operator_is_named():
    with pytest.raises(UnsupportedOperator, match=r"aten\.rand\.generator.*explicit torch\.Generator"):
        run_step("test_execute:explicit_generator_model", ratio=1.0)


def test_divergence_names_the_operator_and_line(mixed):
    lines = [dict(line) for line in mixed.lines]
    position = next(i for i, line in enumerate(lines) if line["INSTRUCTION"] == "CALL" and line["NAME"] == "addmm")
    lines[position]["NAME"] = "mm"
    altered = dataclasses.replace(mixed, lines=lines)
    with pytest.raises(Divergence, match=rf"log line {position + 1}: it emitted CALL addmm\(.*where the trace has "
                                         r"CALL mm\("):
        run_step(altered, ratio=1.0)


def test_time_cost_is_refused():
    with pytest.raises(ValueError, match="deterministic cost model"):
        capture_step("lstm", cost="time")


# -- heavier: every zoo model, a modern model, the hole --------------------------------

ZOO = {  # model: (batch, three ratios: a failure, near the feasibility threshold, well above it)
    "resnet32": (1, (0.80, 0.90, 0.97)),
    "densenet45": (1, (0.40, 0.55, 0.80)),
    "densenet121": (1, (0.45, 0.60, 0.85)),
    "transformer": (1, (0.90, 0.995, 1.0)),
    "unet": (1, (0.70, 0.90, 0.97)),
    "lstm": (2, (0.85, 0.93, 0.99)),
    "treelstm": (1, (0.85, 0.97, 0.99)),
    "unroll_gan": (8, (0.60, 0.75, 0.90)),
}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(ZOO))
def test_zoo_decision_identity_at_three_budgets(model):
    batch, ratios = ZOO[model]
    captured = capture_step(model, batch=batch)
    reference = reference_step(model, batch=batch)
    statuses = []
    for ratio in ratios:
        executed = run_step(captured, ratio=ratio)
        assert_same_decisions(executed, captured.trace, "dtr", executed.run.budget_bytes)
        statuses.append(executed.status)
        if executed.passed:
            assert_bit_identical(executed, reference)
    assert "pass" in statuses


@pytest.mark.slow
def test_modern_model_decision_identity():
    pytest.importorskip("transformers", reason="hf: models need the models extra")
    options = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100, seq=64, batch=4)
    captured = capture_step("hf:llama", **options)
    reference = reference_step("hf:llama", **options)
    statuses = []
    for ratio in (0.5, 0.8, 1.0):
        executed = run_step(captured, ratio=ratio)
        assert_same_decisions(executed, captured.trace, "dtr", executed.run.budget_bytes)
        statuses.append(executed.status)
        if executed.passed:
            assert_bit_identical(executed, reference)
    assert "pass" in statuses


@pytest.mark.slow
@pytest.mark.parametrize("model, batch, ratios", [("unroll_gan", 8, "0.70:0.76:0.002"),
                                                  ("resnet32", 1, "0.83:0.86:0.002")])
def test_a_census_hole_fails_for_real_and_both_sides_pass(model, batch, ratios):
    captured = capture_step(model, batch=batch)
    frame = sweep(captured.trace, "dtr", ratios=ratios, execution=Execution(cache=False, progress=False))
    hole = find_holes(frame).holes.iloc[0]  # the census finds it on the trace of this very step
    reference = reference_step(model, batch=batch)
    below = run_step(captured, budget_bytes=int(hole.pass_below_bytes))
    inside = run_step(captured, budget_bytes=int(hole.fail_low_bytes))
    above = run_step(captured, budget_bytes=int(hole.pass_above_bytes))
    assert (below.status, above.status) == ("pass", "pass") and inside.status in ("oom", "thrash")
    simulated = assert_same_decisions(inside, captured.trace, "dtr", int(hole.fail_low_bytes))
    assert inside.run.failure == simulated.failure and inside.run.failure is not None
    for executed in (below, above):
        assert_same_decisions(executed, captured.trace, "dtr", executed.run.budget_bytes)
        assert_bit_identical(executed, reference)


GPT2 = dict(layers=2, hidden=64, heads=4, vocab=100, seq=64, batch=4)


@pytest.mark.slow
def test_gpt2_meta_trace_diverges_where_dropout_changes_the_attention_kernel():
    pytest.importorskip("transformers", reason="hf: models need the models extra")
    # On the meta device capture runs the CPU flash-attention kernel; real CPU tensors with attention
    # dropout (GPT-2's 0.1) take the math path: the real step does not match the meta trace.
    with pytest.raises(Divergence, match=r"emitted CALL mul\(.*where the trace has CALL "
                                         r"_scaled_dot_product_flash_attention_for_cpu\("):
        run_step(capture_step("hf:gpt2", **GPT2), ratio=1.0)


@pytest.mark.slow
def test_gpt2_decision_identity_on_the_real_capture():
    pytest.importorskip("transformers", reason="hf: models need the models extra")
    captured = capture_step("hf:gpt2", real=True, **GPT2)
    reference = reference_step("hf:gpt2", **GPT2)
    for ratio in (0.25, 0.5, 0.9):  # thrash, pass, pass
        executed = run_step(captured, ratio=ratio)
        assert_same_decisions(executed, captured.trace, "dtr", executed.run.budget_bytes)
        if executed.passed:
            assert_bit_identical(executed, reference)
    assert executed.passed


def test_cli_executes_and_reports(capsys):
    import json

    from dtrlab.cli import main

    assert main(["execute", "test_execute:mixed_model", "--ratio", "1.0", "--json", "--evictions"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "pass" and record["device"] == "cpu" and record["evicted_storages"] == []
    assert main(["execute", "test_execute:mixed_model", "--budget", "1000"]) == 2
    assert "below the step's minimum" in capsys.readouterr().err
    assert main(["execute", "test_execute:explicit_generator_model", "--ratio", "1.0"]) == 2
    assert capsys.readouterr().err.startswith("dtrlab execute: error: aten.rand.generator")


def test_the_gpu_section_of_the_allocator_script_says_when_there_is_no_gpu(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the section would run for real")
    script = Path(__file__).resolve().parent.parent / "scripts" / "validate_allocator_cuda.py"
    done = subprocess.run([sys.executable, str(script), "--sections", "execute"], capture_output=True, text=True,
                          env=dict(os.environ, OUT=str(tmp_path)))
    assert done.returncode == 3 and done.stderr.startswith("validate_allocator_cuda: no CUDA device")
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("memory", [{}, dict(memory="caching"), dict(memory="aligned", enforce="allocated")])
def test_a_record_round_trips_through_json_without_tensors(mixed, memory, tmp_path):
    """What notebook 11 ships of a run (dtrlab.execute.record): every RunResult field, the memory timeline,
    the recomputations and the wall time come back equal; at 0.4 and 1.0 of the flat peak."""
    import json

    from dtrlab.execute.record import from_record, record_key, save_record

    for ratio in (0.4, 1.0):
        budget = int(simulate(mixed.trace, "dtr", ratio=1.0).peak_memory * ratio)
        executed = run_step(mixed, budget_bytes=budget, semantics=Semantics(**memory))
        path = save_record(tmp_path, executed, record_key(mixed, budget, semantics=Semantics(**memory)))
        back = from_record(json.loads(path.read_text()))
        assert back.run == executed.run and back.status == executed.status
        assert (back.memory_timeline, back.recomputations, back.wall_seconds, back.allocator) == \
               (executed.memory_timeline, executed.recomputations, executed.wall_seconds, executed.allocator)
        assert back.loss is None and back.gradients == {} and back.parameters == {}  # a record holds no tensors
    assert any(json.loads(p.read_text())["run"]["failure"] for p in tmp_path.glob("*.json"))  # a Failure too
