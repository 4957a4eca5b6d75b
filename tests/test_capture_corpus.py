"""The modern corpus in traces/models/: manifest, sizes, replay peaks, regeneration."""

from __future__ import annotations

import gzip
import json
import shlex
from pathlib import Path

import pytest
from conftest import load_script

from dtrlab.integrity import sha256_file
from dtrlab.runtime import baseline
from dtrlab.trace import load_directory, load_log

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
MODELS = TRACES / "models"


def entries():
    return json.loads((MODELS / "manifest.json").read_text())["models"]


def test_manifest_records_command_and_versions():
    fields = {"name", "title", "desc", "log", "has_start", "model", "source", "batch_size", "input_shape", "dtype",
              "device", "torch_version", "versions", "cost_model", "ops", "peak_live_bytes", "command", "sha256", "bytes"}
    listed = entries()
    assert len(listed) >= 10
    readme = (TRACES / "README.md").read_text()
    for entry in listed:
        assert fields <= set(entry), entry["log"]
        assert (MODELS / entry["log"]).is_file() and f"`{entry['log']}`" in readme
        assert entry["device"] == "meta" and {"torch", "dtrlab"} <= set(entry["versions"])
        command = shlex.split(entry["command"])
        assert command[:3] == ["dtrlab", "capture", entry["source"]]
        assert command[command.index("--out") + 1] == f"traces/models/{entry['log']}"
        assert command[command.index("--batch") + 1] == str(entry["batch_size"])
        assert sha256_file(MODELS / entry["log"]) == entry["sha256"]
        assert (MODELS / entry["log"]).stat().st_size == entry["bytes"]


def test_corpus_has_a_moe_decoder_a_diffusion_transformer_and_a_long_context_step():
    by_model = {e["model"]: e for e in entries()}
    moe, dit, long_context = by_model["olmoe"], by_model["dit-xl-2"], by_model["llama-1b-8k"]
    assert moe["source"] == "hf:olmoe" and "64 experts" in moe["desc"] and "16 layers" in moe["desc"]
    assert dit["source"] == "diffusers:dit-xl-2" and "28 blocks" in dit["desc"]
    assert long_context["source"] == "hf:llama" and "--seq 8192" in long_context["command"]
    traces = load_directory(MODELS)
    moe_ops = [op.name for op in traces[moe["log"].removesuffix(".jsonl.gz")].operators]
    # 16 layers x (2 grouped matmuls forward + 2 x 2 backward) over the experts
    assert moe_ops.count("_grouped_mm") == 16 * 6
    # the 8k step has the 2k step's operators (Llama 3.2 1B's 16 layers) on 4x longer sequences, batch 1
    assert abs(long_context["ops"] - by_model["llama-1b"]["ops"]) < 10


@pytest.mark.slow
def test_moe_decoder_meta_trace_equals_real_trace():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers", reason="hf: models need the models extra")
    from dtrlab.trace.capture import capture
    from dtrlab.trace.models import ModelSourceError

    sizes = dict(layers=2, hidden=64, heads=4, kv_heads=4, intermediate=32, vocab=100, seq=16, batch=2)
    meta = capture("hf:olmoe", cost="roofline:A100", dtype=torch.bfloat16, **sizes)
    real = capture("hf:olmoe", cost="roofline:A100", dtype=torch.bfloat16, real=True, **sizes)
    assert meta.lines == real.lines and meta.peak_live_bytes == real.peak_live_bytes
    assert sum(line.get("NAME") == "_grouped_mm" for line in meta.lines) == 2 * 6
    with pytest.raises(ModelSourceError, match="hf:olmoe: .*bfloat16"):  # grouped matmuls take 16-bit floats only
        capture("hf:olmoe", cost="flops", **sizes)


def test_grouped_matmul_costs_two_flops_per_multiply_add():
    torch = pytest.importorskip("torch")
    from dtrlab.trace.capture import record

    class Experts(torch.nn.Module):  # 4 experts of 32 -> 48 over 64 rows sorted by expert
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 48, 32, dtype=torch.bfloat16))

        def forward(self, rows):
            offsets = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
            out = torch.nn.functional.grouped_mm(rows, self.weight.transpose(-2, -1), offs=offsets)
            return (out * out).sum()

    with torch.device("meta"):
        rows = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
        recording = record(Experts(), rows, cost="flops")
    costs = [int(line["TIME"]) for line in recording.lines if line.get("NAME") == "_grouped_mm"]
    # forward (64x32 @ 32x48 per group), gradient of the weight (48x64 @ 64x32 per group) and of the rows
    assert costs == [2 * 64 * 32 * 48] * 3


def test_corpus_is_small():
    compressed = sum(p.stat().st_size for p in TRACES.rglob("*") if p.is_file())
    assert compressed < 25 * 2**20  # the whole of traces/, logs gzip-compressed


def test_corpus_loads_and_replays_to_its_recorded_peak():
    traces = load_directory(MODELS)
    assert len(traces) == len(entries())
    for entry in entries():
        trace = traces[entry["log"].removesuffix(".jsonl.gz")]
        assert baseline(trace).peak_memory == entry["peak_live_bytes"]
        assert sum(1 for op in trace.operators if not op.is_constant) == entry["ops"]


@pytest.mark.slow
def test_a_modern_trace_regenerates_identically():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision", reason="torchvision: models need the models extra")
    make_traces = load_script("make_traces")
    entry = next(e for e in entries() if e["model"] == "resnet50")
    if entry["torch_version"] != torch.__version__:
        pytest.skip(f"recorded with torch {entry['torch_version']}")
    source, options, _ = make_traces.MODERN["resnet50"]
    from dtrlab.trace.capture import capture

    recording = capture(source, cost=entry["cost_model"], dtype=getattr(torch, entry["dtype"]), **options)
    with gzip.open(MODELS / entry["log"], "rt") as shipped:
        assert recording.to_jsonl() == shipped.read()
    assert load_log(MODELS / entry["log"]).name == "resnet50-b64"
