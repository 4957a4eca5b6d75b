"""The trace recorder (dtrlab.trace.capture), its model zoo and the shipped corpus.

Exact op sequences below are those of torch 2.13 (the pinned version): autograd's
own calls (``detach`` of saved outputs, ``ones_like`` of the loss) are part of them.
"""

import gzip
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from dtrlab.runtime import baseline  # noqa: E402
from dtrlab.trace import load_log  # noqa: E402
from dtrlab.trace import zoo  # noqa: E402
from dtrlab.cli import main  # noqa: E402
from dtrlab.trace.capture import record  # noqa: E402

TRACES = Path(__file__).resolve().parent.parent / "traces"
F32 = 4


def ops(lines):
    """(instruction, name) of every CALL and MUTATE, in order."""
    return [(line["INSTRUCTION"], line["NAME"]) for line in lines if line["INSTRUCTION"] in ("CALL", "MUTATE")]


def split_at_backward(lines):
    at = lines.index({"INSTRUCTION": "ANNOTATE", "ANNOTATION": "BACKWARD"})
    return lines[:at], lines[at + 1:]


def results(lines):
    """result name -> (MEMORY, ALIAS) from the lines that follow each CALL."""
    memory = {line["NAME"]: int(line["MEMORY"]) for line in lines if line["INSTRUCTION"] == "MEMORY"}
    alias = {line["NAME"]: int(line["ALIAS"]) for line in lines if line["INSTRUCTION"] == "ALIAS"}
    return {name: (memory[name], alias[name]) for name in alias}


def replay_peak(recording, tmp_path, name="trace.jsonl.gz"):
    return baseline(load_log(recording.write(tmp_path / name))).peak_memory


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.layers(x)


class ViewsInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 6))

    def forward(self, x):
        y = x @ self.w  # (2, 6): a new 48-byte storage
        z = y.view(3, 4)  # alias of y
        z.mul_(2)  # in place, through the view
        return z.transpose(0, 1).relu()


def test_mlp_log_is_exact(tmp_path):
    torch.manual_seed(0)
    rec = record(MLP(), torch.randn(2, 8), cost="flops")
    lines = rec.lines
    assert lines[0] == {"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"}

    # Six parameters and the input: CONSTANT, MEMORY (bytes), COPY, RELEASE each.
    constants = [line for line in lines if line["INSTRUCTION"] == "CONSTANT"]
    sizes = [int(lines[lines.index(c) + 1]["MEMORY"]) for c in constants]
    assert sizes == [8 * 16 * F32, 16 * F32, 16 * 16 * F32, 16 * F32, 16 * 4 * F32, 4 * F32, 2 * 8 * F32]
    assert sum(line["INSTRUCTION"] == "COPY" for line in lines) == 7

    forward, backward = split_at_backward(lines)
    assert ops(forward) == [("CALL", "t"), ("CALL", "addmm"), ("CALL", "relu"), ("CALL", "detach")] * 2 + [
        ("CALL", "t"), ("CALL", "addmm"), ("CALL", "sum")]
    sizes = results(forward)
    calls = [line for line in forward if line["INSTRUCTION"] == "CALL"]
    for call in calls:
        (result,) = call["RESULT"]
        if call["NAME"] in ("t", "detach"):
            assert sizes[result] == (0, 0)  # a view of its only argument
        else:
            assert sizes[result][1] == -1
    assert [sizes[c["RESULT"][0]][0] for c in calls if c["NAME"] == "addmm"] == [2 * 16 * F32, 2 * 16 * F32, 2 * 4 * F32]

    names = [name for _, name in ops(backward)]
    # Weight gradients of all three layers, input gradients of the upper two only.
    assert names.count("mm") == 5
    assert names.count("threshold_backward") == 2
    assert names.count("sum") == 3
    assert not any(line["INSTRUCTION"] == "MUTATE" for line in lines)
    assert rec.op_count == len(ops(lines))
    assert replay_peak(rec, tmp_path) == rec.peak_live_bytes


def test_views_and_in_place_ops(tmp_path):
    rec = record(ViewsInPlace(), torch.ones(2, 4), cost="flops")
    forward, _ = split_at_backward(rec.lines)
    assert ops(forward) == [("CALL", "mm"), ("CALL", "view"), ("MUTATE", "mul_"), ("CALL", "transpose"),
                            ("CALL", "relu"), ("CALL", "detach"), ("CALL", "sum")]
    calls = {line["NAME"]: line for line in forward if line["INSTRUCTION"] in ("CALL", "MUTATE")}
    sizes = results(forward)
    mm, view = calls["mm"]["RESULT"][0], calls["view"]["RESULT"][0]
    assert sizes[mm] == (2 * 6 * F32, -1)
    assert calls["view"]["ARGS"] == [mm] and sizes[view] == (0, 0)
    assert calls["mul_"]["ARGS"] == [view] and calls["mul_"]["MUTATE"] == [0]
    assert calls["mul_"]["TIME"] == str(12)  # one FLOP per written element
    assert calls["transpose"]["ARGS"] == [view] and sizes[calls["transpose"]["RESULT"][0]] == (0, 0)
    assert sizes[calls["relu"]["RESULT"][0]] == (12 * F32, -1)
    # Every non-constant name is released once at most, and only after it was created.
    created, released = set(), set()
    for line in rec.lines:
        if line["INSTRUCTION"] == "ALIAS":
            created.add(line["NAME"])
        elif line["INSTRUCTION"] == "RELEASE" and line["NAME"] in created:
            assert line["NAME"] not in released
            released.add(line["NAME"])
    assert released
    assert replay_peak(rec, tmp_path) == rec.peak_live_bytes == 328


def test_batch_norm_running_stats_are_mutations():
    bn = nn.BatchNorm1d(3)
    lines = record(bn, torch.randn(4, 3), cost="flops").lines
    (mutate,) = [line for line in lines if line["INSTRUCTION"] == "MUTATE" and line["NAME"] == "native_batch_norm"]
    assert mutate["MUTATE"] == [3, 4] and mutate["TIME"] == "0"  # running_mean, running_var


def test_timed_costs_leave_the_step_unchanged():
    torch.manual_seed(0)
    model = ViewsInPlace()
    x = torch.randn(2, 4)
    expected = model(x).detach()
    out = []
    rec = record(model, x, loss_fn=lambda y: out.append(y.detach()) or y.sum(), cost="time", repeats=3)
    # In-place operators are repeated on clones, so the recorded step computes what an unrecorded one does.
    assert torch.equal(out[0], expected)
    times = [int(line["TIME"]) for line in rec.lines if line["INSTRUCTION"] in ("CALL", "MUTATE")]
    assert all(t >= 0 for t in times) and max(times) > 0
    assert rec.meta["cost_model"] == "time" and rec.meta["cost_unit"] == "ns"


def test_flop_traces_are_deterministic():
    first = zoo.build("lstm", batch=2)
    second = zoo.build("lstm", batch=2)
    a = record(first.module, first.inputs, loss_fn=first.loss_fn, cost="flops")
    b = record(second.module, second.inputs, loss_fn=second.loss_fn, cost="flops")
    assert a.to_jsonl() == b.to_jsonl()


@pytest.mark.parametrize("name", ["resnet32", "densenet45", "transformer", "unet", "lstm", "treelstm", "unroll_gan"])
def test_replayed_peak_matches_measured_peak(name, tmp_path):
    workload = zoo.build(name, batch=2)
    rec = record(workload.module, workload.inputs, loss_fn=workload.loss_fn, cost="flops")
    assert 100 < rec.op_count < 5000
    # The measurement follows storages, the log follows tensors: they must agree.
    assert replay_peak(rec, tmp_path) == rec.peak_live_bytes


def test_capture_command_writes_a_loadable_log(tmp_path, capsys):
    out = tmp_path / "lstm.jsonl.gz"
    assert main(["capture", "lstm", "--batch", "2", "--out", str(out), "--cost", "flops"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == "lstm" and summary["batch"] == 2 and summary["cost_model"] == "flops"
    assert baseline(load_log(out)).peak_memory == summary["peak_live_bytes"]


def corpus():
    return json.loads((TRACES / "manifest.json").read_text())["models"]


def test_corpus_manifest_and_size():
    entries = corpus()
    assert len(entries) >= 6
    fields = {"name", "title", "desc", "log", "has_start", "model", "batch_size", "input_shape", "torch_version",
              "cost_model", "ops", "peak_live_bytes", "command"}
    for entry in entries:
        assert fields <= set(entry)
        assert (TRACES / entry["log"]).is_file() and entry["model"] in zoo.MODELS
    assert sum(p.stat().st_size for p in TRACES.iterdir()) < 10 * 2**20


@pytest.mark.parametrize("entry", corpus(), ids=lambda e: e["model"])
def test_corpus_trace_replays_to_its_recorded_peak(entry):
    trace = load_log(TRACES / entry["log"])
    assert baseline(trace).peak_memory == entry["peak_live_bytes"]
    assert sum(1 for op in trace.operators if not op.is_constant) == entry["ops"]


@pytest.mark.parametrize("entry", corpus(), ids=lambda e: e["model"])
def test_corpus_trace_regenerates_identically(entry):
    if entry["torch_version"] != torch.__version__:
        pytest.skip(f"recorded with torch {entry['torch_version']}")
    workload = zoo.build(entry["model"], batch=entry["batch_size"])
    rec = record(workload.module, workload.inputs, loss_fn=workload.loss_fn, cost=entry["cost_model"])
    with gzip.open(TRACES / entry["log"], "rt") as shipped:
        assert rec.to_jsonl() == shipped.read()
