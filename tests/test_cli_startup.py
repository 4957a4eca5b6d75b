"""CLI startup: each subcommand imports only what it uses (no pandas for run and info)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

LOG = str(ROOT / "traces" / "unet-b2.jsonl.gz")
HEAVY = ("pandas", "pyarrow", "tqdm", "joblib", "matplotlib", "scipy")

# Runs the command line in a fresh interpreter and prints the heavy top-level modules it imported.
PROBE = """
import json, sys
from dtrlab.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "heavy": sorted({m.split('.')[0] for m in sys.modules} & set(%r))}))
""" % (HEAVY,)


def probe(*argv: str, cache) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "DTRLAB_CACHE": str(cache)})
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["run", LOG, "--ratio", "0.9"], ["info", LOG], ["run", "--help"]],
                         ids=["run", "info", "help"])
def test_run_and_info_import_no_pandas(argv, tmp_path):
    for attempt in ("parse", "cached"):  # the first run parses the log, the second loads it from the cache
        result = probe(*argv, cache=tmp_path)
        assert result["code"] == 0, (attempt, result)
        assert result["heavy"] == [], (attempt, result)


def test_python_m_dtrlab_importtime_has_no_pandas(tmp_path):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "dtrlab", "run", LOG, "--ratio", "0.9"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "DTRLAB_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "dtrlab.runtime" in imported and "pandas" not in imported and "pyarrow" not in imported


def test_commands_that_need_pandas_still_get_it(tmp_path):
    sweep_file = tmp_path / "s.parquet"
    result = probe("sweep", LOG, "--ratios", "0.9,1.0", "--no-cache", "--quiet", "--out", str(sweep_file),
                   cache=tmp_path)
    assert result["code"] == 0 and "pandas" in result["heavy"]
    assert probe("holes", str(sweep_file), cache=tmp_path)["code"] == 0


# Runs each command line given as JSON in one fresh interpreter; prints each one's status, its error and whether
# torch had been imported by then.
NO_TORCH_PROBE = """
import contextlib, io, json, sys
from dtrlab.cli import main
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    print(json.dumps({"code": code, "err": err.getvalue(), "torch": "torch" in sys.modules}))
"""


def test_an_unknown_model_is_refused_before_torch_is_imported(tmp_path):
    """A misspelt model source: one line with the closest source, status 2, and torch never imported (it took
    5 s to import torch and then say "unknown model")."""
    refusals = {("check", "lama", "--device", "A100-80GB", "--budget", "1GiB"): "'lama' (did you mean 'hf:llama'?)",
                ("knob", "gpt3"): "'gpt3' (did you mean 'hf:gpt2'?)",
                ("knob", "hf:gpt3"): "'hf:gpt3' (did you mean 'hf:gpt2'?); hf: presets are gpt2, gpt2-medium",
                ("execute", "resnt32", "--ratio", "0.5"): "'resnt32' (did you mean 'resnet32'?)",
                ("capture", "diffusers:sd", "--out", str(tmp_path / "x.jsonl")):
                    "'diffusers:sd' (did you mean 'diffusers:sd-unet'?); diffusers: models are sd-unet, dit-xl-2"}
    done = subprocess.run([sys.executable, "-c", NO_TORCH_PROBE, json.dumps([list(argv) for argv in refusals])],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "DTRLAB_CACHE": str(tmp_path)})
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(refusals), done.stderr[-2000:]
    for (argv, expected), result in zip(refusals.items(), results):
        assert result["code"] == 2 and result["err"].count("\n") == 1, (argv, result)
        assert f"dtrlab {argv[0]}: error: argument " in result["err"] and f"unknown model {expected}" in result["err"]
        assert not result["torch"], argv


def test_the_torch_free_source_names_are_the_zoo_and_libraries_names():
    pytest.importorskip("torch", reason="the zoo needs the torch extra")
    from dtrlab.trace import models, zoo
    from dtrlab.trace.sources import ZOO_NAMES, check_source

    assert tuple(zoo.MODELS) == ZOO_NAMES
    with pytest.raises(models.ModelSourceError, match=r"unknown model 'lama' \(did you mean 'hf:llama'\?\)"):
        models.build("lama")  # the library refuses it in the same words
    for source in ("resnet32", "hf:llama", "diffusers:dit-xl-2", "torchvision:resnet50", "mypackage.models:build"):
        check_source(source)  # named models, and sources whose names need their import, pass


def test_the_sweep_and_knob_options_offer_the_engine_backends():
    import argparse

    from dtrlab.cli.sweep import add_sweep_arguments
    from dtrlab.sweep import BACKENDS

    parser = argparse.ArgumentParser()
    add_sweep_arguments(parser)
    (backend,) = [action for action in parser._actions if action.dest == "backend"]
    assert tuple(backend.choices) == tuple(BACKENDS)
    from dtrlab.cli import knob

    parser = argparse.ArgumentParser()
    knob.register(parser.add_subparsers())
    (knob_parser,) = parser._subparsers._group_actions[0].choices.values()
    (executor,) = [action for action in knob_parser._actions if action.dest == "executor"]
    assert tuple(executor.choices) == tuple(BACKENDS)  # dtrlab knob --executor: the same backends


def test_a_command_builds_only_its_own_parser(tmp_path):
    """``dtrlab run`` neither imports nor builds the other commands' parsers; help and a misspelt command
    still see every command."""
    code = ("import sys; from dtrlab.cli import main; code = main(sys.argv[1:]); "
            "print(sorted(m for m in sys.modules if m.startswith('dtrlab.cli.') and m != 'dtrlab.cli.common'))")
    run = lambda *argv: subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,  # noqa: E731
                                       cwd=ROOT, env={**os.environ, "DTRLAB_CACHE": str(tmp_path)})
    done = run("--debug", "run", LOG, "--ratio", "0.9")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['dtrlab.cli.run']"
    done = run("rnu", LOG)
    assert "did you mean 'run'?" in done.stderr and "frontier" in done.stderr
    from dtrlab.cli import COMMANDS
    help_text = subprocess.run([sys.executable, "-m", "dtrlab", "--help"], capture_output=True, text=True, cwd=ROOT).stdout
    assert all(command in help_text for command in COMMANDS)
