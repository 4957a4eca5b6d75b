"""CUDA Inductor's lowering on a machine without a GPU (dtrlab.trace.torch_compile.gpu_target,
dtrlab.trace.torch_compile.cuda_joint): a named GPU's answers inside the block only, a small graph and a tiny step
lowered for an H100, attention as CUDA's dispatcher picks it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from dtrlab.trace.torch_compile.cuda_joint import (CUDA_ATTENTION_EXTRAS, MATH_ATTENTION, SWAPPED,  # noqa: E402
                                                   CudaTraceError, additive_mask, efficient_mask, retrace_on_cuda,
                                                   sdp_order, sdpa_backend)
from dtrlab.trace.torch_compile.gpu_target import GPU_TARGETS, gpu_target, patched_names  # noqa: E402
from dtrlab.trace.torch_compile.joint import joint_hash  # noqa: E402
from dtrlab.trace.torch_compile.tracing import for_gpu, trace_joint  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MLP = "tests.test_partition:tiny_mlp"
ATTENTION = "tests.test_cuda_lowering:tiny_attention"
H100 = GPU_TARGETS["H100-80GB"]


def tiny_attention(batch: int = 2):
    """One attention head block without dropout, through ``F.scaled_dot_product_attention``: on fake CPU tensors
    torch's CPU dispatcher picks its flash kernel; CUDA's picks memory-efficient attention for float32."""
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

        def forward(self, x):
            q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 16).permute(2, 0, 3, 1, 4)
            return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))

    return Attention(), torch.randn(batch, 8, 32), lambda y: y.sum()


def _lowered_wrapper(function, *inputs) -> str:
    """The Python wrapper CUDA Inductor generates for ``function`` traced on fake CUDA ``inputs`` (make_fx), under
    the H100's answers: ``compile_fx_inner``, stopped where the wrapper's module would load its kernels."""
    from torch._inductor import compile_fx
    from torch._inductor.graph import GraphLowering
    from torch.fx.experimental.proxy_tensor import make_fx

    graph_module = make_fx(function)(*inputs)
    generated: list[str] = []

    def source_only(self):
        generated.append(self.codegen()[0].value)
        raise KeyboardInterrupt  # not an Exception: Inductor does not wrap it

    original = GraphLowering.compile_to_module
    GraphLowering.compile_to_module = source_only
    try:
        with gpu_target("H100-80GB"), torch._guards.tracing(torch._guards.TracingContext(inputs[0].fake_mode)):
            compile_fx.compile_fx_inner(graph_module, list(inputs))
    except KeyboardInterrupt:
        pass
    finally:
        GraphLowering.compile_to_module = original
    return generated[0]


def test_the_gpu_answers_inside_the_block_only():
    from torch._inductor.runtime.hints import DeviceProperties
    from torch.utils._triton import has_triton
    from triton.runtime import driver

    patches = patched_names(H100)
    originals = [(owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name))
                 for owner, name, _ in patches]
    before = torch.cuda.is_available(), has_triton(), torch.cuda.device_count()
    with gpu_target("H100-80GB") as target:
        assert target is H100
        assert torch.cuda.is_available() and has_triton()
        assert torch.cuda.get_device_capability() == (9, 0) and torch.cuda.get_device_name() == H100.name
        assert DeviceProperties.create(torch.device("cuda", 0)).multi_processor_count == 132
        assert (driver.active.get_current_target().arch, driver.active.get_current_target().warp_size) == (90, 32)
    # The machine's own answers again (no GPU here: False, False, 0), has_triton's cached answer forgotten.
    assert (torch.cuda.is_available(), has_triton(), torch.cuda.device_count()) == before
    for owner, name, original in originals:
        restored = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        assert restored is original, f"{owner}.{name} not restored"
    with pytest.raises(ValueError, match=r"unknown GPU 'H100-80G'.*did you mean 'H100-80GB'"):
        with gpu_target("H100-80G"):
            pass


def test_a_small_graph_lowers_to_the_wrapper_an_h100_runs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(64, 64, device="cuda"), torch.empty(64, 64, device="cuda")
    source = _lowered_wrapper(lambda a, b: (torch.mm(a, b).relu().sum(), torch.sin(a)), a, b)
    assert "empty_strided_cuda((64, 64), (64, 1), torch.float32)" in source
    assert "extern_kernels.mm(" in source
    assert source.count("= async_compile.triton(") == 2  # relu+sum fused into one reduction, sin its own
    assert "multi_processor_count=132, cc=90" in source  # the H100's properties, in each kernel's metadata
    assert "empty_strided_cpu(" not in source.split("def call(")[1]


def test_a_cpu_compile_after_the_gpu_lowering_is_unchanged():
    from torch._inductor.utils import run_and_get_code

    def step(x):
        return (x.relu() * 2).sum(0)

    def compiled_cpu_code() -> tuple:
        torch._dynamo.reset()
        result, code = run_and_get_code(torch.compile(step, backend="inductor"), torch.ones(8, 8))
        torch._dynamo.reset()
        return result.tolist(), code

    before = compiled_cpu_code()
    test_a_small_graph_lowers_to_the_wrapper_an_h100_runs()
    assert compiled_cpu_code() == before


@pytest.mark.parametrize("dtype, gpu, mask, causal, expected", [
    (torch.float32, "H100-80GB", False, False, "efficient"),  # flash needs 16-bit floats
    (torch.float16, "H100-80GB", False, True, "flash"),
    (torch.bfloat16, "A100-80GB", False, False, "flash"),
    (torch.float16, "H100-80GB", True, False, "efficient"),  # flash takes no attention mask
    (torch.float16, "V100-32GB", False, False, "efficient"),  # flash needs capability 8.0
    (torch.bfloat16, "V100-32GB", False, False, "math"),  # nor bfloat16 on the memory-efficient kernel before 8.0
])
def test_attention_kernel_is_cuda_dispatchers_choice(dtype, gpu, mask, causal, expected):
    """In torch's default order (cuDNN after math: never reached), as on GPUs below capability 9."""
    q = torch.empty(2, 4, 16, 64, dtype=dtype, device="meta")
    attn_mask = torch.empty(16, 16, dtype=torch.bool, device="meta") if mask else None
    assert sdp_order() == ("flash", "efficient", "math", "cudnn") == sdp_order(GPU_TARGETS["A100-80GB"])
    assert sdpa_backend(q, q, q, attn_mask, causal, GPU_TARGETS[gpu], sdp_order()) == expected


def test_on_an_h100_cudnn_attention_comes_first_for_16_bit_attention(monkeypatch):
    """sdp_utils.cpp puts cuDNN first on capability 9.x/10.x with a cuDNN above 9.15 (torch 2.14.1+cu130 brings
    9.24), unless TORCH_CUDNN_SDPA_DEPRIORITIZED is set; cuDNN takes float16/bfloat16 with a mask or grouped
    heads, a dropout in sixteenths, and is ruled out by enforced deterministic algorithms or an old cuDNN."""
    assert sdp_order(H100) == ("cudnn", "flash", "efficient", "math") == sdp_order(GPU_TARGETS["H200-141GB"])
    q, kv = torch.empty(2, 4, 16, 64, dtype=torch.bfloat16), torch.empty(2, 2, 16, 64, dtype=torch.bfloat16)
    mask = torch.ones(16, 16, dtype=torch.bool)
    order, runtime = sdp_order(H100), (92400, False)
    assert sdpa_backend(q, q, q, None, True, H100, order, 0.0, runtime) == "cudnn"
    assert sdpa_backend(q, kv, kv, mask, False, H100, order, 0.125, runtime) == "cudnn"  # 2/16
    assert sdpa_backend(q, q, q, None, False, H100, order, 0.1, runtime) == "flash"  # 0.1 is no sixteenth
    assert sdpa_backend(q, q, q, None, False, H100, order, 0.0, (92400, True)) == "flash"  # deterministic
    assert sdpa_backend(q.float(), q.float(), q.float(), None, False, H100, order, 0.0, runtime) == "efficient"
    assert sdpa_backend(q, q, q, None, False, H100, order, 0.125, (91200, False)) == "flash"  # 9.11-9.13: no dropout
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    assert sdp_order(H100) == sdp_order()


def test_attention_rules_follow_the_enabled_kernels_and_shapes():
    q, k = (torch.empty(2, 4, n, 64, dtype=torch.float16, device="meta") for n in (16, 32))
    assert sdpa_backend(q, k, k, None, True, H100, sdp_order()) == "efficient"  # causal, not square
    wide = torch.empty(2, 4, 16, 512, dtype=torch.float16, device="meta")
    assert sdpa_backend(wide, wide, wide, None, False, H100, sdp_order()) == "efficient"  # head above 256
    assert sdpa_backend(q, q, q, None, False, H100, ("efficient", "math")) == "efficient"  # flash disabled
    assert sdpa_backend(q, q, q, None, False, H100, ("math",)) == "math"


def test_a_boolean_mask_reaches_the_efficient_kernel_as_the_composite_hands_it():
    """attention.cpp's ``convert_boolean_attn_mask`` (0 where True, minus infinity where False, in the query's
    dtype) and ``preprocess_mask`` (aligned: a view expanded to batch, heads, queries, keys; unaligned: first a
    copy padded to a multiple of 8 columns, sliced back)."""
    mask = torch.tensor([[True, False, True]] * 2)
    additive = additive_mask(mask, torch.bfloat16)
    assert additive.dtype == torch.bfloat16 and additive.tolist() == [[0.0, float("-inf"), 0.0]] * 2
    assert additive_mask(additive, torch.float32) is additive and additive_mask(None, torch.float32) is None
    query, key = torch.empty(2, 4, 8, 16), torch.empty(2, 4, 24, 16)
    aligned = torch.zeros(2, 1, 8, 24)
    expanded = efficient_mask(aligned, query, key)
    assert expanded.shape == (2, 4, 8, 24) and expanded.data_ptr() == aligned.data_ptr()
    unaligned = torch.zeros(2, 1, 8, 21)
    padded = efficient_mask(unaligned, query, key[:, :, :21])
    assert padded.shape == (2, 4, 8, 21) and padded.data_ptr() != unaligned.data_ptr()
    assert padded.untyped_storage().nbytes() == 2 * 8 * 24 * 4 and padded.stride()[-2] == 24


def _trace(source: str, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trace_joint(source, backend="inductor", **options)


def _operators(joint) -> set[str]:
    return {str(node.target) for node in joint.graph_module.graph.nodes if node.op == "call_function"}


def test_an_mlp_step_is_partitioned_and_lowered_for_an_h100():
    from dtrlab.memory.partitioned import knob_peaks

    cpu, gpu = _trace(MLP), _trace(MLP, gpu="H100-80GB")
    assert gpu.gpu == "H100-80GB" and ("gpu", "H100-80GB") in gpu.build_options
    assert {node.meta["val"].device.type for node in gpu.graph_module.graph.find_nodes(op="placeholder")} == {"cuda"}
    assert gpu.operator_nodes() == cpu.operator_nodes()  # same nodes, same names: forcings name the same nodes
    assert len({joint_hash(cpu), joint_hash(gpu), joint_hash(for_gpu(cpu, "A100-80GB"))}) == 3
    row = knob_peaks(gpu, 0.5, cache=False)
    [(forward, backward)] = gpu.lowerings.values()
    for source, _, _ in (forward, backward):
        body = source.split("def call(")[1]
        assert "empty_strided_cuda(" in body and "empty_strided_cpu(" not in body and ".run(" in body
    # Measured: this MLP's CUDA plan holds the CPU plan's bytes at its peak.
    assert row["flat_peak"] == knob_peaks(cpu, 0.5, cache=False)["flat_peak"]


def test_the_lowering_sends_no_kernel_to_be_compiled_even_with_a_warm_worker_pool(monkeypatch):
    """With Inductor's compile workers ready, Triton's define_kernel sends each kernel it generates to be compiled
    (torch/_inductor/codegen/triton.py:8166-8170: ptxas for the GPU's architecture, minutes of CPU a large model): the
    lowering keeps one compile thread, so none is sent (before: ptxas processes minutes old behind the 12-layer
    GPT-2's H100 lowering)."""
    from concurrent.futures import Future

    from torch._inductor import async_compile

    from dtrlab.trace.torch_compile.inductor import partition_lowered

    ready = Future()
    ready.set_result(None)
    monkeypatch.setattr(async_compile.AsyncCompile, "_ready_future", ready)
    monkeypatch.setattr(async_compile, "_process_pool_allowed", lambda: True)
    sent = []
    monkeypatch.setattr(async_compile.AsyncCompile, "triton", lambda self, name, *args, **kwargs: sent.append(name))
    # Inductor's own patch (monkeypatch's undo would delete the entry, which hides it: torch/utils/_config_module.py)
    with torch._inductor.config.patch(compile_threads=2):
        assert async_compile.AsyncCompile.use_process_pool()  # the pool this test stands for is ready
        partition_lowered(_trace(MLP, gpu="H100-80GB"), 0.5)
    assert sent == []


def test_attention_becomes_cudas_kernel_in_the_gpu_joint():
    cpu, gpu = _trace(ATTENTION), _trace(ATTENTION, gpu="H100-80GB")
    assert {"aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"} <= _operators(cpu)
    # Only the table's operators differ, and float32 attention takes the memory-efficient kernel's pair.
    assert _operators(cpu) - _operators(gpu) == set(SWAPPED)
    assert _operators(gpu) - _operators(cpu) == {cuda_ops[1] for cuda_ops in SWAPPED.values()}
    # docs/compile.md's table names every operator the joints may differ by.
    documented = (ROOT / "docs" / "compile.md").read_text()
    named = {*SWAPPED, *(op for ops in SWAPPED.values() for op in ops), *CUDA_ATTENTION_EXTRAS, *MATH_ATTENTION}
    for operator in named - {"<built-in function getitem>"}:
        assert f"`{operator.removesuffix('.default')}`" in documented, operator
    with pytest.raises(CudaTraceError, match=r"CPU-only operator aten._scaled_dot_product_flash_attention_for_cpu"):
        retrace_on_cuda(cpu.graph_module, cpu.joint_inputs, None, "H100-80GB", cpu.source)


def test_knob_cli_lowers_for_the_gpu_it_is_given(capsys, tmp_path):
    import json

    from dtrlab.cli import main

    assert main(["knob", MLP, "--knobs", "0.5", "--device", "H100-80GB", "--executor", "sequential", "--quiet",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Inductor accounting: CUDA Inductor's lowering for H100-80GB" in out and "CPU Inductor" not in out
    [written] = tmp_path.glob("*.json")
    assert written.name == "tests.test_partition-tiny_mlp-H100-80GB.json"
    assert json.loads(written.read_text())["meta"]["inductor_lowering"] == "H100-80GB"
    assert main(["knob", MLP, "--device", "H100-80G"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown device 'H100-80G' (did you mean 'H100-80GB'?)" in err


def test_every_gpu_preset_is_a_lowering_target_and_a_real_device_finds_its_own():
    from types import SimpleNamespace

    from dtrlab.memory.device import GPU_PRESETS
    from dtrlab.trace.torch_compile.gpu_target import matching_target

    assert {name: target.total_memory for name, target in GPU_TARGETS.items()} == GPU_PRESETS
    assert matching_target(SimpleNamespace(name=H100.name)) == "H100-80GB"
    # An H100 as a driver reports it: another name, 79.1 GiB of global memory.
    reported = SimpleNamespace(name="NVIDIA H100 SXM5", major=9, minor=0, multi_processor_count=132,
                               total_memory=84_929_347_584)
    assert matching_target(reported) == "H100-80GB"
    assert matching_target(SimpleNamespace(name="NVIDIA T4", major=7, minor=5, multi_processor_count=40,
                                           total_memory=15 << 30)) is None
