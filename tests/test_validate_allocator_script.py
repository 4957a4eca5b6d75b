"""scripts/validate_allocator_cuda.py without a GPU: against a stand-in ``torch`` whose allocator is
the ``caching`` model itself (tests/stand_ins/torch), every section must match (this checks the
script's plumbing, not the model), a stand-in that checks a per-process limit differently must be
caught, and a machine without CUDA gets one line, exit status 3 and a JSON file saying so."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "validate_allocator_cuda.py"
STAND_IN = Path(__file__).resolve().parent / "stand_ins"


def run_script(*args, stand_in=True, **env):
    environment = dict(os.environ, **env)
    if stand_in:
        environment["PYTHONPATH"] = os.pathsep.join([str(STAND_IN), str(ROOT)])
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=environment)


def test_every_section_matches_the_stand_in(tmp_path):
    done = run_script("--ratios", "0.4,0.7", "--checkpoints", "5", OUT=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "validate_allocator_cuda.json").read_text())
    assert results["status"] == "match" and results["mismatches"] == 0
    sections = results["sections"]
    assert [part["conf"] for part in sections["layout"]] == ["", "expandable_segments:True"]
    assert all(part["predicted_by"] == {"allocation_size": True, "mapped": False}
               for part in sections["expandable-limit"])
    assert len(sections["semantics"]) == 6 and all(part["calls"] > 0 for part in sections["semantics"])


def test_a_different_limit_check_is_a_mismatch(tmp_path):
    out = tmp_path / "r.json"
    done = run_script("--sections", "expandable-limit", "--out", str(out), STAND_IN_LIMIT_CHECK="mapped")
    assert done.returncode == 1
    assert json.loads(out.read_text())["mismatches"] == 2


def test_bad_input_is_one_line():
    done = run_script("--sections", "layout,bogus")
    assert done.returncode == 2
    assert done.stderr == "validate_allocator_cuda: error: unknown section(s) bogus; valid: layout, " \
                          "expandable-limit, semantics, execute, knob, compile, cuda-lowering, op-temporaries\n"


@pytest.mark.parametrize("models, message", [
    ("{transformer}", "not JSON (Expecting property name enclosed in double quotes at character 1)"),
    ('["transformer"]', "a JSON object of sources and their build options"),
    ('{"transformer": 8}', "a JSON object of sources and their build options")])
def test_compile_models_bad_input_is_one_line(models, message):
    done = run_script("--sections", "compile", "--compile-models", models)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("validate_allocator_cuda: error: argument --compile-models: " + message)


def _script():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import validate_allocator_cuda as script
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return script


def test_compile_models_parse():
    script = _script()
    args = script.parse_args(["--sections", "compile,knob", "--compile-models", '{"hf:llama": {"layers": 2}}'])
    assert args.sections == ["compile", "knob"] and args.compile_models == {"hf:llama": {"layers": 2}}
    assert args.compile_backend == "inductor"
    assert script.parse_args([]).compile_models == script.COMPILE_MODELS and "compile" not in script.DEFAULT_SECTIONS


def test_cuda_lowering_models_parse_and_wrappers_compare_line_by_line():
    from types import SimpleNamespace

    script = _script()
    args = script.parse_args(["--sections", "cuda-lowering", "--lowering-models", '{"hf:gpt2": {"layers": 1}}'])
    assert args.sections == ["cuda-lowering"] and args.lowering_models == {"hf:gpt2": {"layers": 1}}
    assert len(script.parse_args([]).lowering_models) == 4 and "cuda-lowering" not in script.DEFAULT_SECTIONS

    # a joint graph's memo of lowered (forward, backward) wrappers, as dtrlab.trace.torch_compile.inductor's
    def joint(*sources):
        return SimpleNamespace(parts=(), lowerings={"pair": tuple((source, {}, []) for source in sources)})

    same, other = "buf0 = empty_strided_cuda((4, ), (1, ), torch.float32)\ndel buf0", "del buf0"
    compared = script.compared_wrappers(joint(same, same), joint(same, other))
    assert [(c["wrapper"], c["differing_lines"]) for c in compared] == [(0, 0), (1, 1)]
    assert compared[1]["first_differences"] == ["-buf0 = empty_strided_cuda((4, ), (1, ), torch.float32)"]
    assert script.compared_wrappers(joint(same, same), joint(same))[1]["differing_lines"] == -1


def test_op_temporaries_models_parse_and_a_steps_temporaries_are_summed_by_operator():
    """The op-temporaries section's options, and its per-operator summary of a step's measured temporaries, on a
    CPU step (a convolution's oneDNN temporaries, where the GPU's would be cuDNN's): one per convolution call."""
    pytest.importorskip("torch")
    from dtrlab.trace.torch_compile.partition import partition
    from dtrlab.trace.torch_compile.tracing import trace_joint

    script = _script()
    args = script.parse_args(["--sections", "op-temporaries", "--temporaries-models", '{"torchvision:resnet18": {}}'])
    assert args.sections == ["op-temporaries"] and args.temporaries_models == {"torchvision:resnet18": {}}
    assert script.parse_args([]).temporaries_models == script.TEMPORARIES_MODELS
    assert "op-temporaries" not in script.DEFAULT_SECTIONS
    trace = partition(trace_joint("tests.test_inductor:tiny_cnn", backend="aot_eager"), 1.0).trace
    summary = script.temporaries_by_operator(trace)
    convolutions = sum(op.name == "convolution" for op in trace.operators)
    assert convolutions and summary["convolution_temporary"]["calls"] == convolutions
    for entry in summary.values():
        assert 0 < entry["largest"] <= entry["bytes"] <= entry["calls"] * entry["largest"]


@pytest.mark.parametrize("sections", [[], ["--sections", "compile,knob,cuda-lowering,op-temporaries"]])
def test_without_cuda_one_line_and_status_3(tmp_path, sections):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the script would run for real")
    done = run_script(*sections, stand_in=False, OUT=str(tmp_path))
    assert done.returncode == 3 and len(done.stderr.splitlines()) == 1 and "no CUDA device" in done.stderr
    assert json.loads((tmp_path / "validate_allocator_cuda.json").read_text())["status"] == "no-cuda"
