"""The Inductor accounting (dtrlab.trace.inductor): Inductor's own lowering of each partition, checked against
real ``torch.compile(backend="inductor")`` steps on the CPU with two instruments (tests/compiled_steps.py)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from dtrlab.memory.partitioned import knob_peaks, step_peaks, step_record  # noqa: E402
from dtrlab.trace.inductor import partition_lowered  # noqa: E402
from dtrlab.trace.partition import partition, trace_joint  # noqa: E402
from tests.compiled_steps import measure_compiled_run, rss_peak  # noqa: E402

MLP = "tests.test_partition:tiny_mlp"
#: The real-step check: one small model per family (by a name: source and build options), six knob values each.
#: Batches large enough that the step's largest tensor (the RSS tolerance) is above RSS's noise (Python's and
#: autograd's own objects, tens of kB), small enough to compile and run in seconds. ResNet-18 twice: at its
#: own 224x224 images, and at 32x32, where its weights outweigh its activations (a strict xfail, below).
FAMILIES = {
    "llama": ("hf:llama", dict(batch=8, seq=64, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128,
                               vocab=256)),
    "seq2seq": ("tests.compiled_steps:tiny_seq2seq", dict(batch=32)),
    "resnet18-224": ("torchvision:resnet18", dict(batch=8, image=224)),
    "resnet18-32": ("torchvision:resnet18", dict(batch=8, image=32)),
    "vit": ("tests.compiled_steps:tiny_vit", dict(batch=32)),
}
KNOBS = (1.0, 0.7, 0.5, 0.3, 0.1, 0.0)


def _trace(source: str, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trace_joint(source, backend="inductor", **options)


@pytest.fixture(scope="module")
def mlp_joint():
    return _trace(MLP)


def _prediction(step) -> tuple[int, int]:
    """The step's flat peak above the bytes live before it, and the largest tensor of the step.

    The trace counts the constants (parameters, inputs, the tangent) from the start; a real
    step starts with all but the tangent (the loss's gradient, allocated by autograd) live."""
    peaks = step_peaks(step)
    assert peaks["flat_peak"] == step.recorded_peak_bytes  # the log's replay and the storages' own count agree
    constants = [op for op in step.trace.operators if op.is_constant]
    tangent = constants[-1].total_size  # declared last (dtrlab.trace.partition.run_graphs)
    return peaks["flat_peak"] - sum(op.total_size for op in constants) + tangent, \
        max(op.total_size for op in step.trace.operators)


def test_inductor_row_and_backend_checks(mlp_joint):
    row = knob_peaks(mlp_joint, 0.5)
    assert row["backend"] == "inductor" and row["flat_peak"] == row["recorded_peak"]
    assert row["flat_peak"] <= row["allocated_peak"] <= row["reserved_peak"]
    assert row["recompute_flops"] is None  # the wrapper's trace is no compute model
    aot = knob_peaks(mlp_joint, 0.5, backend="aot_eager")
    assert aot["backend"] == "aot_eager" and aot["recompute_flops"] is not None
    with pytest.raises(ValueError, match="unknown backend 'inductr'.*did you mean 'inductor'"):
        knob_peaks(mlp_joint, 0.5, backend="inductr")


def test_inductor_row_passes_the_solver_and_forcing_on(mlp_joint):
    """Under Inductor too, knob_peaks's row is the lowering of the partition asked for: greedy's, one saved forward
    tensor forced recomputed."""
    name = sorted({s.name for s in partition(mlp_joint, 0.5).saved} & mlp_joint.forward_nodes)[0]
    row = knob_peaks(mlp_joint, 0.5, solver="greedy", force={name: "recompute"})
    step = partition_lowered(mlp_joint, 0.5, solver="greedy", force={name: "recompute"})
    assert row == step_record(step) and row["solver"] == "greedy" and row["backend"] == "inductor"
    assert name in step.recomputed and row["recomputed_count"] > knob_peaks(mlp_joint, 0.5)["recomputed_count"]


def test_aot_eager_joint_refuses_the_inductor_accounting():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = trace_joint(MLP)
    with pytest.raises(ValueError, match="trace it with backend='inductor'"):
        knob_peaks(joint, 0.5, backend="inductor")


def test_each_distinct_partition_is_lowered_once(mlp_joint, monkeypatch):
    import dtrlab.trace.inductor as module

    lowered = []
    lower = module.lower
    monkeypatch.setattr(module, "lower", lambda *args, **kwargs: lowered.append(1) or lower(*args, **kwargs))
    mlp_joint.lowerings.clear()
    mlp_joint.lowered_records.clear()
    steps = [partition_lowered(mlp_joint, knob) for knob in (1.0, 0.9, 0.8, 0.0)]
    distinct = {(s.saved, s.recomputed) for s in steps}
    assert len(lowered) == 2 * len(distinct) < 2 * len(steps)
    # The same partition gives the same trace whether lowered now or remembered.
    again = partition_lowered(mlp_joint, 0.9)
    assert again.trace.content_hash == steps[1].trace.content_hash


def test_a_step_with_graph_breaks_is_lowered_graph_by_graph(monkeypatch):
    """Each graph's joint is the one Inductor partitions, with its own capture; each distinct (forward, backward)
    pair of each graph is lowered once; the wrappers run graph by graph give the real Inductor step's peak
    (measured by the profiler in tests/test_user_corpus.py's slow test: 534,576 B above the constants at knob
    1.0, 469,040 B at 0.0)."""
    import dtrlab.trace.inductor as module
    from dtrlab.trace.inductor import graph_key

    joint = _trace("tests.user_corpus:graph_break")
    assert len(joint.parts) == 3 and all(part.backend == "inductor" and part.inductor is not None
                                         for part in joint.parts)
    assert len({id(part.inductor.fake_mode) for part in joint.parts}) == 3  # a fake mode per dynamo compile
    lowered = []
    lower = module.lower
    monkeypatch.setattr(module, "lower", lambda *args, **kwargs: lowered.append(1) or lower(*args, **kwargs))
    knobs = (1.0, 0.5, 0.0)
    steps = [partition_lowered(joint, knob) for knob in knobs]
    predicted = [_prediction(step)[0] for step in steps]
    # Inductor's wrappers ran, forward and backward: kernels and buffers, no graph node named (docs/compile.md)
    assert all(set(step.trace.meta["node_names"]) == {""} for step in steps)
    assert all(len(step.trace.meta["node_names"]) == len(step.trace.operators) for step in steps)
    distinct = {(c, graph_key(forward), graph_key(backward)) for knob in knobs
                for c, (forward, backward) in enumerate(partition(joint, knob, keep_graphs=True).graphs)}
    assert len(lowered) == 2 * len(distinct)
    assert predicted[0] == 534_576 and predicted[2] == 469_040


def _allocations(step) -> int:
    """Storages the step's operators allocate (views and constants aside)."""
    return sum(1 for op in step.trace.operators if not op.is_constant
               for size, alias in zip(op.sizes, op.aliases) if alias == -1 and size > 0)


def test_inductor_fuses_what_aot_eager_materialises(mlp_joint):
    """Fusion: under Inductor the GELU MLP's step allocates fewer buffers than its graphs run node by node
    (GELU's erf, multiplications and additions are one kernel writing one buffer)."""
    inductor = _allocations(partition_lowered(mlp_joint, 1.0))
    aot_eager = _allocations(partition(mlp_joint, 1.0))
    assert inductor < aot_eager, (inductor, aot_eager)


#: CPU Inductor's convolutions run oneDNN kernels whose weight reorders are allocated inside the kernel:
#: measured at knob 0.5 (batch 8, 32x32), the real peak is 18,874,368 B above the prediction, two
#: 512x512x3x3 float32 weights' worth, beyond that step's one-tensor tolerance. Strict: a pass is news. At
#: 224x224 the same 18 MiB (at knobs 1.0, 0.7 and 0.1; 0.3-3.3 MB at 0.5 and 0.3) is within the tolerance
#: (the first convolution's 25,690,112-byte output).
_CNN_LIMIT = pytest.mark.xfail(strict=True, reason="CPU convolution's oneDNN temporaries are not in the wrapper")


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=_CNN_LIMIT) if name == "resnet18-32" else name
                                  for name in FAMILIES])
def test_prediction_is_the_real_inductor_peak(name):
    """Prediction against the real CPU Inductor step, two instruments, six knob values.

    Profiler (allocator events): within the step's largest tensor either way, the tolerance for
    kernels' internal temporaries (CPU convolution's scratch buffers), which a wrapper's
    allocations do not show; measured equal to the byte on the MLP and the encoder-decoder (knobs
    1.0 and 0.7, the generated wrappers line for line the real compile's). Peak RSS (a fresh process,
    ``MALLOC_MMAP_THRESHOLD_=4096``, ``malloc_trim(0)`` before the step): within the step's
    largest tensor either way. RSS counts pages, not bytes: a tensor under the threshold that
    shares a page already resident reads as less, one that starts a page as a whole page,
    and malloc's own pages are in it (measured on the encoder-decoder at knob 1.0: 32,504
    bytes above the prediction, its largest tensor 36,864 bytes).
    """
    source, options = FAMILIES[name]
    joint = _trace(source, **options)
    peaks = set()
    for knob in KNOBS:
        predicted, largest = _prediction(partition_lowered(joint, knob))
        _, profiled = measure_compiled_run(source, knob, "inductor", **options)
        assert abs(profiled - predicted) <= largest, (knob, profiled, predicted, largest)
        rss = rss_peak(source, knob, "inductor", **options)
        assert abs(rss - predicted) <= largest, (knob, rss, predicted, largest)
        peaks.add(predicted)
    assert len(peaks) > 1  # the knob reached Inductor's partitioner
