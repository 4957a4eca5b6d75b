"""A ``module:function`` source that puts its step on CUDA itself (``model.cuda()``, ``.to("cuda")``,
``device="cuda"``, ``with torch.device("cuda")``; tests/user_cuda.py) is the step of a GPU: built on the CPU, then
traced and lowered for the GPU named, or for this machine's own (issue 54 item 3)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from dtrlab.trace.models import build, fake_workload  # noqa: E402
from dtrlab.trace.torch_compile import gpu_target, tracing  # noqa: E402
from dtrlab.trace.torch_compile.joint import joint_hash  # noqa: E402

CUDA_SOURCES = ["tests.user_cuda:method", "tests.user_cuda:moved", "tests.user_cuda:context"]


def _trace(source: str, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tracing.trace_joint(source, backend="inductor", **options)


@pytest.mark.parametrize("source", CUDA_SOURCES)
def test_a_source_that_asks_for_cuda_is_built_on_the_build_device_and_says_so(source):
    with fake_workload(source) as workload:
        assert workload.built_for_cuda
        tensors = [*workload.module.parameters(), *workload.inputs]
        assert {t.device.type for t in tensors} == {"cpu"}
    assert {p.device.type for p in build(source).module.parameters()} == {"meta"}  # dtrlab capture's build
    with fake_workload("tests.user_cuda:on_cpu") as workload:
        assert not workload.built_for_cuda


def test_without_a_gpu_a_cuda_source_asks_for_its_gpu_in_one_line(capsys):
    from dtrlab.cli import main

    assert not torch.cuda.is_available()
    assert main(["knob", "tests.user_cuda:method", "--knobs", "0,1"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert "puts its step on CUDA and this machine has no GPU; name the GPU it trains on (--device" in error
    assert "H100-80GB" in error


def test_a_cuda_source_named_a_gpu_is_the_cpu_sources_step_for_that_gpu():
    """The same step, whichever way its function asked for CUDA, and the one an on-CPU source gets with ``gpu``."""
    expected = joint_hash(_trace("tests.user_cuda:on_cpu", gpu="H100-80GB"))
    for source in CUDA_SOURCES:
        joint = _trace(source, gpu="H100-80GB")
        assert joint.gpu == "H100-80GB" and joint_hash(joint) == expected, source


def test_on_a_gpu_machine_a_cuda_source_is_lowered_for_that_gpu(monkeypatch):
    """With no GPU named, the machine's own (``machine_gpu``), and that GPU's step; a source on the CPU stays there."""
    monkeypatch.setattr(tracing, "machine_gpu", lambda source: "A100-80GB")
    joint = _trace("tests.user_cuda:method")
    assert joint.gpu == "A100-80GB"
    assert joint_hash(joint) == joint_hash(_trace("tests.user_cuda:on_cpu", gpu="A100-80GB"))
    assert _trace("tests.user_cuda:on_cpu").gpu is None


def test_the_machines_gpu_is_the_target_its_properties_match(monkeypatch):
    h100 = gpu_target.GPU_TARGETS["H100-80GB"]
    reported = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                               total_memory=h100.total_memory - (1 << 30))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: reported)
    assert gpu_target.machine_gpu("m:f") == "H100-80GB"
    reported.name, reported.multi_processor_count = "NVIDIA T4", 40
    with pytest.raises(ValueError, match=r"^m:f puts its step on CUDA, on a NVIDIA T4 that no GPU target matches; "
                                         r"name the GPU it trains on \(--device, or device= in Python\): V100-16GB"):
        gpu_target.machine_gpu("m:f")


def _on_fake_cuda(model, *tensors):
    """``model`` and ``tensors`` as a GPU machine's user holds them after ``.cuda()``, without a GPU: fake tensors
    on ``cuda:0`` (made from meta twins; no CUDA call)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def on_cuda(tensor):
        return mode.fake_tensor_converter.from_meta_and_device(mode, tensor.to("meta"), torch.device("cuda", 0))

    for module in model.modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(on_cuda(parameter.detach()), parameter.requires_grad))
    return model, [on_cuda(t) for t in tensors]


def test_a_live_model_on_cuda_is_fitted_for_its_machines_gpu(monkeypatch):
    """``dtrlab.fit_knob`` on a live model the user put on CUDA (faked here, as is the machine's GPU): the step of
    that GPU, traced from a CPU copy (the loss's CUDA labels twinned there), lowered and labelled for it: the same
    answer as the CPU model's with that GPU named. With ``device="cpu"`` it is the CPU's lowering."""
    from dtrlab.analysis.fit_knob import fit_knob, lowering_for

    asked = []
    monkeypatch.setattr(tracing, "machine_gpu", lambda source: asked.append(source) or "A100-80GB")

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))

    x, labels = torch.randn(32, 64), torch.randint(0, 10, (32,))
    fit = dict(budget=1 << 30, accounting="allocated", backend="inductor", cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fit_knob(mlp(), (x,), lambda out: torch.nn.functional.cross_entropy(out, labels),
                            device="A100-80GB", **fit)
        model, (cuda_x, cuda_labels) = _on_fake_cuda(mlp(), x, labels)
        answered = fit_knob(model, (cuda_x,), lambda out: torch.nn.functional.cross_entropy(out, cuda_labels), **fit)
        assert asked == ["Sequential"]
        on_cpu = fit_knob(model, (cuda_x,), lambda out: torch.nn.functional.cross_entropy(out, cuda_labels),
                          device="cpu", **fit)
        # a CPU model asked about on "cuda": this machine's GPU too
        cpu_model_on_cuda = fit_knob(mlp(), (x,), lambda out: torch.nn.functional.cross_entropy(out, labels),
                                     device="cuda", **fit)
    assert expected.lowering == answered.lowering == cpu_model_on_cuda.lowering == "A100-80GB"
    assert on_cpu.lowering == "cpu"
    assert answered.graph_hash == expected.graph_hash == cpu_model_on_cuda.graph_hash != on_cpu.graph_hash
    for fitted in (answered, cpu_model_on_cuda):
        assert (fitted.knob, fitted.peak, fitted.evaluated) == (expected.knob, expected.peak, expected.evaluated)
    assert cuda_labels.device.type == "cuda"  # the loss's labels restored after the trace
    assert lowering_for(model, None) == lowering_for(model, "cuda:0") == lowering_for(model, "cuda") == "A100-80GB"
    assert lowering_for(mlp(), "cuda") == lowering_for(mlp(), "cuda:1") == "A100-80GB"
    assert lowering_for(model, "cpu") == lowering_for(mlp(), None) == lowering_for(mlp(), "cpu") == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks a machine without a GPU")
@pytest.mark.parametrize("what", ["module", "source"])
def test_cuda_asked_on_a_machine_without_a_gpu_is_one_line_naming_the_presets(what):
    """``device="cuda"`` means this machine's GPU: without one, the line that names the GPU presets (the trace
    on fake CUDA tensors would stop in the autograd engine's device guard: "hasPrimaryContext expects a valid
    device index")."""
    from dtrlab.analysis.fit_knob import fit_knob

    if what == "module":
        model = torch.nn.Sequential(torch.nn.Linear(8, 8))
        arguments, name = (model, (torch.randn(4, 8),)), "Sequential"
    else:
        arguments, name = ("tests.test_partition:tiny_mlp",), "tests.test_partition:tiny_mlp"
    with pytest.raises(ValueError) as raised:
        fit_knob(*arguments, budget=1 << 30, device="cuda", cache=False)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{name} puts its step on CUDA and this machine has no GPU; ")
    assert "H100-80GB" in message
