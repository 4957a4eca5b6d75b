"""The modern corpus in traces/models/: manifest, sizes, replay peaks, regeneration."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shlex
from pathlib import Path

import pytest

from dtrlab.runtime import baseline
from dtrlab.trace import load_directory, load_log

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
MODELS = TRACES / "models"


def entries():
    return json.loads((MODELS / "manifest.json").read_text())["models"]


def test_manifest_records_command_and_versions():
    fields = {"name", "title", "desc", "log", "has_start", "model", "source", "batch_size", "input_shape", "dtype",
              "device", "torch_version", "versions", "cost_model", "ops", "peak_live_bytes", "command"}
    listed = entries()
    assert len(listed) >= 6
    readme = (TRACES / "README.md").read_text()
    for entry in listed:
        assert fields <= set(entry), entry["log"]
        assert (MODELS / entry["log"]).is_file() and f"`{entry['log']}`" in readme
        assert entry["device"] == "meta" and {"torch", "dtrlab"} <= set(entry["versions"])
        command = shlex.split(entry["command"])
        assert command[:3] == ["dtrlab", "capture", entry["source"]]
        assert command[command.index("--out") + 1] == f"traces/models/{entry['log']}"
        assert command[command.index("--batch") + 1] == str(entry["batch_size"])


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
    spec = importlib.util.spec_from_file_location("make_traces", ROOT / "scripts" / "make_traces.py")
    make_traces = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_traces)
    entry = next(e for e in entries() if e["model"] == "resnet50")
    if entry["torch_version"] != torch.__version__:
        pytest.skip(f"recorded with torch {entry['torch_version']}")
    source, options, _ = make_traces.MODERN["resnet50"]
    from dtrlab.trace.capture import capture

    recording = capture(source, cost=entry["cost_model"], dtype=getattr(torch, entry["dtype"]), **options)
    with gzip.open(MODELS / entry["log"], "rt") as shipped:
        assert recording.to_jsonl() == shipped.read()
    assert load_log(MODELS / entry["log"]).name == "resnet50-b64"
