"""Capture without memory (meta device), the roofline cost model and model sources.

The meta-device trace of a model must be the real-tensor trace: the same
operators, sizes, aliases, releases and order, line for line.
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from dtrlab.runtime import baseline  # noqa: E402
from dtrlab.trace import load_log  # noqa: E402
from dtrlab.cli import main  # noqa: E402
from dtrlab.trace.capture import capture, record  # noqa: E402
from dtrlab.trace.costs import GPUS, roofline_ns  # noqa: E402
from dtrlab.trace.models import ModelSourceError, build  # noqa: E402


def calls(recording):
    return [line for line in recording.lines if line["INSTRUCTION"] == "CALL"]


@pytest.mark.parametrize("name", ["transformer", "unroll_gan"])
def test_meta_trace_equals_real_trace(name):
    meta = capture(name, batch=2, cost="flops")
    real = capture(name, batch=2, cost="flops", real=True)
    assert meta.meta["device"] == "meta" and real.meta["device"] == "cpu"
    assert meta.lines == real.lines
    assert meta.peak_live_bytes == real.peak_live_bytes


def test_meta_trace_equals_real_trace_llama():
    pytest.importorskip("transformers", reason="hf: models need the models extra")
    sizes = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100, seq=16, batch=2)
    meta = capture("hf:llama", cost="roofline:A100", **sizes)
    real = capture("hf:llama", cost="roofline:A100", real=True, **sizes)
    assert meta.lines == real.lines and meta.peak_live_bytes == real.peak_live_bytes
    # Grouped-query flash attention, as on a GPU: 4 query heads over 2 key/value heads.
    attention = [c for c in calls(meta) if c["NAME"] == "_scaled_dot_product_flash_attention_for_cpu"]
    assert len(attention) == 2


def test_meta_capture_allocates_no_tensor_data():
    # 2 x 8192 x 8192 float32 = 512 MiB of input and 256 MiB of weight; nothing is allocated.
    model = nn.Linear(8192, 8192, bias=False, device="meta")
    x = torch.randn(2, 8192, 8192, device="meta")
    rec = record(model, x, cost="flops")
    assert rec.meta["device"] == "meta"
    assert rec.peak_live_bytes >= (2 * 8192 * 8192 + 8192 * 8192) * 4


class _MatmulRelu(nn.Module):
    def forward(self, a, b):
        return torch.relu(a @ b)


def _step_costs(dtype, cost):
    a = torch.randn(1024, 1024, device="meta", dtype=dtype, requires_grad=True)
    b = torch.randn(1024, 1024, device="meta", dtype=dtype)
    rec = record(_MatmulRelu(), (a, b), cost=cost)
    return {c["NAME"]: int(c["TIME"]) for c in calls(rec) if c["NAME"] in ("mm", "relu")}


def test_roofline_costs_by_hand():
    # A100: 19.5 TFLOP/s float32, 312 TFLOP/s bf16 tensor cores, 2039 GB/s.
    mib = 2**20
    f32 = _step_costs(torch.float32, "roofline:A100")
    # mm: 2 x 1024^3 FLOPs at the float32 peak (compute-bound): 110,127.4 ns, rounded up.
    assert f32["mm"] == math.ceil(2 * 1024**3 / 19.5e12 * 1e9) == 110128
    # relu: reads 4 MiB and writes 4 MiB (memory-bound): 8 MiB / 2039 GB/s = 4,114.1 ns.
    assert f32["relu"] == math.ceil(8 * mib / 2039e9 * 1e9) == 4115
    bf16 = _step_costs(torch.bfloat16, "roofline:A100")
    assert bf16["mm"] == math.ceil(2 * 1024**3 / 312e12 * 1e9) == 6883  # tensor cores
    assert bf16["relu"] == math.ceil(4 * mib / 2039e9 * 1e9) == 2058
    flops = _step_costs(torch.float32, "flops")
    assert flops == {"mm": 2 * 1024**3, "relu": 1024**2}
    h100 = _step_costs(torch.float32, "roofline:H100")
    assert h100["mm"] == math.ceil(2 * 1024**3 / 67e12 * 1e9)


def test_gpu_table():
    assert set(GPUS) >= {"A100", "H100", "H200", "L4"}
    for gpu in GPUS.values():
        assert gpu.tensor_16bit_flops > gpu.fp32_flops > 1e13 and gpu.memory_bandwidth > 1e11 and gpu.source
    assert roofline_ns(GPUS["A100"], 0, 0, False) == 0


def test_cli_captures_on_meta_and_writes_a_loadable_log(tmp_path, capsys):
    out = tmp_path / "unet.jsonl.gz"
    assert main(["capture", "unet", "--batch", "2", "--cost", "roofline:L4", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["device"] == "meta" and summary["cost_model"] == "roofline:L4" and summary["cost_unit"] == "ns"
    assert summary["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert baseline(load_log(out)).peak_memory == summary["peak_live_bytes"]


def test_pinned_bytes_by_hand():
    # The constants W (32x64) and x (8x64), float32: 8192 + 2048 bytes; at the step's end W, x and
    # W.grad (8192) are live: the outputs, pinned then. The peak adds the 4-byte loss and the
    # 4-byte seed of its gradient.
    rec = record(nn.Linear(64, 32, bias=False, device="meta"), torch.randn(8, 64, device="meta"), cost="flops")
    assert rec.pinned_bytes == 8192 + 2048 + 8192
    assert rec.peak_live_bytes == rec.pinned_bytes + 8
    assert rec.pinned_fraction == rec.pinned_bytes / rec.peak_live_bytes


def test_capture_warns_when_pinned_storages_dominate(tmp_path, capsys):
    # A linear layer with a small batch: its weight and gradient are almost the whole peak.
    assert main(["capture", "test_capture:wide_linear", "--batch", "2", "--quiet", "--out", str(tmp_path / "w.jsonl")]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["pinned_fraction"] > 0.9 and summary["pinned_bytes"] == 2 * 256 * 256 * 4 + 2 * 256 * 4
    assert captured.err.count("\n") == 1 and "warning: " in captured.err and "is pinned" in captured.err
    assert main(["capture", "test_capture:wide_linear", "--batch", "4096", "--quiet", "--out",
                 str(tmp_path / "w.jsonl")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["pinned_fraction"] < 0.5 and captured.err == ""


def wide_linear(batch: int = 2):
    """A user source (``test_capture:wide_linear``): one 256x256 layer with ReLU."""
    return nn.Sequential(nn.Linear(256, 256, bias=False), nn.ReLU()), torch.randn(batch, 256), None


def test_time_cost_needs_real_tensors(tmp_path, capsys):
    with pytest.raises(ValueError, match="--real"):
        capture("lstm", batch=2, cost="time")
    assert main(["capture", "lstm", "--cost", "bogus", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "argument --cost: invalid choice: 'bogus'" in capsys.readouterr().err


def test_unknown_model_names_the_sources(capsys, tmp_path):
    with pytest.raises(ModelSourceError, match=r"unknown model 'resnet51'.*torchvision:NAME.*hf:NAME"):
        build("resnet51")
    with pytest.raises(ModelSourceError, match=r"unknown model 'hf:gpt5'.*gpt2, gpt2-medium"):
        build("hf:gpt5")
    with pytest.raises(ModelSourceError, match=r"unknown model 'no_such_module:make'.*ModuleNotFoundError"):
        build("no_such_module:make")
    assert main(["capture", "resnet51", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "unknown model 'resnet51'" in capsys.readouterr().err
    with pytest.raises(ModelSourceError, match="apply to hf: models only"):
        build("unet", layers=2)


def test_unknown_torchvision_model():
    pytest.importorskip("torchvision", reason="torchvision: models need the models extra")
    with pytest.raises(ModelSourceError, match=r"unknown model 'torchvision:resnet51'; torchvision has .*resnet50"):
        build("torchvision:resnet51")


def test_config_that_does_not_build():
    pytest.importorskip("transformers", reason="hf: models need the models extra")
    with pytest.raises(ModelSourceError, match=r"hf:gpt2: the config does not build: .*divisible"):
        build("hf:gpt2", hidden=64, heads=3, layers=1)


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        return y * 2 if y.sum() > 0 else y  # reads a value: meta tensors have none


def data_dependent_model(batch: int = 2):
    """A user source (``test_capture:data_dependent_model``) whose forward reads tensor data."""
    return _DataDependent(), torch.randn(batch, 4), None


def test_a_user_module_is_imported_before_the_model_is_built_on_meta_or_fake_tensors(tmp_path, monkeypatch):
    """A tensor the user's module makes at import (a global constant) stays a real CPU tensor when dtrlab first
    imports the module to build its model on the meta device or on fake tensors: sys.modules keeps the module, and
    the user's own real step with the model reads it next."""
    import sys

    from dtrlab.trace.models import fake_workload

    monkeypatch.syspath_prepend(tmp_path)
    builds = {"dtrlab_test_meta_build": lambda source: build(source),
              "dtrlab_test_fake_build": lambda source: fake_workload(source).__enter__()}
    try:
        for name, built in builds.items():
            (tmp_path / f"{name}.py").write_text(
                "import torch\nfrom torch import nn\nSCALE = torch.arange(4.0)\n\n\n"
                "def model(batch: int = 2):\n    return nn.Linear(4, 4), torch.randn(batch, 4), None\n")
            built(f"{name}:model")
            scale = sys.modules[name].SCALE
            assert type(scale) is torch.Tensor and scale.device.type == "cpu" and scale.tolist() == [0, 1, 2, 3], name
    finally:
        for name in builds:
            sys.modules.pop(name, None)


def test_user_function_source_and_a_forward_that_needs_data():
    real = capture("test_capture:data_dependent_model", batch=3, real=True)
    assert real.meta["batch"] == 3 and real.op_count > 0
    with pytest.raises(ModelSourceError, match=r"test_capture:data_dependent_model: the training step raised on meta "
                                               r"tensors .*(item|meta)"):
        capture("test_capture:data_dependent_model", batch=3)
    with pytest.raises(ModelSourceError, match="takes no seq argument"):
        capture("test_capture:data_dependent_model", seq=3)
