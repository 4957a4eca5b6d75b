"""The CLI's one error path: every bad input of issue 26's probes ends in one line that names
the file or option, exit status 2, no traceback; a bug in one line plus a traceback file;
typos get a suggestion; every --help works; a closed pipe ends quietly."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT
from dtrlab.cli import COMMANDS, main
from test_handbuilt import chain_log

LOG = ROOT / "traces" / "unet-b2.jsonl.gz"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def chain(tmp_path):
    path = tmp_path / "chain.log"
    chain_log().write(path)
    return path


def refused(capsys, argv, *names) -> str:
    """Run ``dtrlab ARGV`` in-process; it must exit 2 with one line naming each of ``names``."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"dtrlab {argv[0]}: error: "), err
    for name in names:
        assert str(name) in err, (name, err)
    return err


@pytest.mark.parametrize("argv", [
    ["run", "{chain}", "--ratio", "inf"],
    ["explain", "{chain}", "--ratio", "nan"],
    ["sweep", "{chain}", "--ratios", "inf", "--no-cache"],
    ["sweep", "{chain}", "--ratios", "0.5:inf:0.1", "--no-cache"],
    ["variants", "{chain}", "--ratios", "0.5,inf", "--no-cache"],
    ["search", "{chain}", "--ratios", "inf", "--trials", "1", "--storage", "{tmp}/s.db"],
    ["run", "{chain}", "--ratio", "0.5", "--overhead-limit", "nan"],
    ["variants", "{chain}", "--overhead-limit", "nan"],
], ids=lambda argv: " ".join(a for a in argv if "{" not in a))
def test_non_finite_numbers_are_refused(capsys, chain, tmp_path, argv):
    argv = [a.format(chain=chain, tmp=tmp_path) for a in argv]
    option = next(argv[i - 1] for i, a in enumerate(argv) if "inf" in a or "nan" in a)
    refused(capsys, argv, option)
    assert not (tmp_path / "s.db").exists()  # refused before anything is written


@pytest.mark.parametrize("argv", [
    ["check", "{chain}", "--device", "A100-80GB", "--budget", "-1GiB"],
    ["check", "{chain}", "--device", "A100-80GB", "--budget=-1GiB"],
    ["check", "{chain}", "--device", "A100-80GB", "--budget", "-1"],
    ["check", "{chain}", "--device", "A100-80GB", "--budget", "0%"],
    ["check", "{chain}", "--budget", "0.5", "--device", "-80GiB"],
    ["check", "{chain}", "--device", "A100-80GB", "--budget", "0.5", "--resolution", "-1MiB"],
    ["run", "{chain}", "--budget", "-1GiB"],
    ["run", "{chain}", "--budget", "0"],
    ["run", "{chain}", "--ratio", "-0.5"],
    ["explain", "{chain}", "--budget=-5"],
    ["run", "{chain}", "--ratio", "0.5", "--enforce", "allocated", "--device-capacity", "-1GiB"],
    ["census", "{chain}", "--resolution", "-1MiB"],
    ["knob", "{census}", "--budget", "-1GiB"],
    ["knob", "{census}", "--budget=0GiB"],
    ["execute", "resnet32", "--budget", "-1GiB"],
    ["capture", "resnet32", "--out", "{tmp}/x.jsonl.gz", "--batch", "-1"],
], ids=lambda argv: " ".join(a for a in argv if "{" not in a))
def test_every_budget_and_size_must_be_positive(capsys, chain, tmp_path, argv):
    """A negative (or zero) budget or size at the end of ``argv``, with a unit or not, after a space or an =, is its
    option's error (argparse alone read -1GiB as an unknown option and said "expected one argument")."""
    census = ROOT / "results" / "shipped" / "knob" / "traces" / "unet-b2.json"
    argv = [a.format(chain=chain, tmp=tmp_path, census=census) for a in argv]
    option, _, value = argv[-1].partition("=") if "=" in argv[-1] else (argv[-2], "", argv[-1])
    refused(capsys, argv, f"argument {option}: must be positive, got '{value}'")


def test_check_and_execute_refuse_their_options_before_any_work(capsys, chain, tmp_path):
    """check's --out and --cost (ignored for a trace, or failing after the census) and execute's --cost and --device
    (failing after torch was imported) are refused as they are parsed."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    check = ["check", chain, "--device", "A100-80GB", "--budget", "0.5"]
    refused(capsys, [*check, "--out", a_file], "argument --out", "is a file")
    refused(capsys, [*check, "--cost", "bogus", "--out", tmp_path / "out"], "argument --cost: invalid choice: 'bogus'")
    refused(capsys, [*check, "--batch", "8", "--layers", "2", "--out", tmp_path / "out"],
            f"--batch, --layers size a model source to capture; {chain} is a trace file")
    assert not (tmp_path / "out").exists()
    refused(capsys, ["execute", "resnet32", "--ratio", "0.5", "--cost", "time"], "argument --cost: invalid choice")
    refused(capsys, ["execute", "resnet32", "--ratio", "0.5", "--device", "gpu"], "argument --device: invalid choice")


def test_frontier_ratios_and_chain(capsys, chain):
    pytest.importorskip("highspy", reason="dtrlab frontier needs the solvers extra")
    pytest.importorskip("ortools", reason="dtrlab frontier needs the solvers extra")
    refused(capsys, ["frontier", chain, "--ratios", "inf"], "--ratios")
    refused(capsys, ["frontier", chain, "--chain", "0"], "--chain")


def test_census_delta_and_grid_bounds(capsys, chain, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    chain_log().write(logs / "chain.log")
    refused(capsys, ["census", logs, "--delta", "inf"], "--delta")
    # delta = 1 is one byte: fine for the chain's 40-byte peak, not for the U-Net's 8 MB (95% of them).
    (logs / "unet-b2.jsonl.gz").write_bytes(LOG.read_bytes())
    peak = 7_995_752
    budgets = int(peak * 1.0) - int(peak * 0.05) - 1  # between the grid's ends, one per byte
    refused(capsys, ["census", logs, "--delta", "1", "--no-cache", "--quiet", "--out", tmp_path / "c"],
            f"delta = 1 bytes makes {budgets:,} budgets, more than the 1,000,000 allowed")
    refused(capsys, ["sweep", chain, "--ratios", "0.5:0.6:1e-9", "--no-cache"], "--ratios", "100,000,001 budgets")
    refused(capsys, ["sweep", chain, "--ratios", "0.5:0.6:1e-300", "--no-cache"], "1e+299 budgets")


def test_broken_files_are_named(capsys, tmp_path):
    not_zip = tmp_path / "logs.zip"
    not_zip.write_text("not a zip")
    refused(capsys, ["info", not_zip], f"{not_zip}: not a zip archive")
    empty = tmp_path / "empty.zip"
    zipfile.ZipFile(empty, "w").close()
    refused(capsys, ["info", empty], f"{empty}: the zip holds no .log or .jsonl file")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(LOG.read_bytes()[:4000])
    refused(capsys, ["run", cut, "--ratio", "0.5"], f"{cut}:", "ends early")
    garbage = tmp_path / "garbage.log"
    garbage.write_bytes(b'{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}\n\xff\xfe\x00binary')
    refused(capsys, ["info", garbage], f"{garbage}:2: cannot be read (not UTF-8 text: invalid start byte at byte 1 ")
    negative = tmp_path / "negative.log"
    negative.write_text('{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}\n{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],'
                        '"RESULT":["r"],"TIME":"-5"}\n{"INSTRUCTION":"MEMORY","NAME":"r","MEMORY":"4"}\n'
                        '{"INSTRUCTION":"ALIAS","NAME":"r","ALIAS":"-1"}\n')
    refused(capsys, ["info", negative], f"{negative}:2: TIME must be >= 0, got -5")


def test_bad_manifests_are_named(capsys, tmp_path):
    directory = tmp_path / "logs"
    directory.mkdir()
    chain_log().write(directory / "chain.log")
    manifest = directory / "manifest.json"
    manifest.write_text(json.dumps({"models": [{"name": "Chain"}]}))
    refused(capsys, ["info", directory], f"{manifest}: model 1 ('Chain') has no \"log\"")
    manifest.write_text('{"models": [\n{"log": ')
    refused(capsys, ["info", directory], f"{manifest}:2: not valid JSON")
    archive = tmp_path / "logs.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.write(directory / "chain.log", "logs/chain.log")
        handle.writestr("logs/manifest.json", json.dumps({"models": [{"name": "Chain", "has_start": True}]}))
    refused(capsys, ["info", archive], f"{archive}!logs/manifest.json: model 1 ('Chain') has no \"log\"")


def test_holes_refuses_what_is_not_a_sweep(capsys, chain, tmp_path):
    import pandas as pd

    frontier = tmp_path / "frontier.parquet"
    pd.DataFrame({"trace": ["chain"], "kind": ["relax"], "budget_bytes": [30], "status": ["optimal"],
                  "overhead_bound": [1.0]}).to_parquet(frontier)
    refused(capsys, ["holes", frontier], f"{frontier} is not a sweep frame (a dtrlab frontier file?)")
    sweep_file = tmp_path / "sweep.parquet"
    assert main(["sweep", str(chain), "--ratios", "0.5,1.0", "--no-cache", "--quiet", "--out", str(sweep_file)]) == 0
    capsys.readouterr()
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(sweep_file.read_bytes()[:200])
    refused(capsys, ["holes", damaged], f"{damaged}: not a readable parquet file")


def test_output_paths_that_are_directories(capsys, chain, tmp_path):
    refused(capsys, ["sweep", chain, "--ratios", "0.5", "--out", tmp_path], "argument --out",
            f"{tmp_path} is a directory")
    refused(capsys, ["variants", chain, "--save", tmp_path], "argument --save")
    refused(capsys, ["search", chain, "--trials", "1", "--storage", tmp_path], "argument --storage")
    refused(capsys, ["sweep", chain, "--ratios", "0.5", "--out", chain / "x.parquet"], "argument --out",
            f"cannot write {chain / 'x.parquet'}: {chain} is not a writable directory")
    refused(capsys, ["search", chain, "--trials", "1", "--export", chain / "p.json"], "argument --export")


def test_counts_and_search_budgets(capsys, chain, tmp_path):
    refused(capsys, ["variants", chain, "--policies", ","], "--policies ',' names no policy")
    refused(capsys, ["search", chain, "--trials", "0", "--storage", tmp_path / "s.db"], "argument --trials")
    refused(capsys, ["search", chain, "--time", "-1", "--storage", tmp_path / "s.db"], "argument --time")
    refused(capsys, ["sweep", chain, "--ratios", "0.5", "-j", "0"], "argument -j/--jobs")
    refused(capsys, ["census", chain, "--resolution", "0"], "argument --resolution")
    refused(capsys, ["run", chain, "--budget", "-3"], "argument --budget")


@pytest.mark.parametrize("storage", ["foreign", "damaged", "text"])
def test_search_leaves_other_files_alone(capsys, chain, tmp_path, storage):
    path = tmp_path / "data.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE measurements (value REAL)")
        db.executemany("INSERT INTO measurements VALUES (?)", [(i,) for i in range(2000)])
    if storage == "damaged":
        path.write_bytes(path.read_bytes()[:100] + b"\0" * 4000)
    elif storage == "text":
        path.write_text("notes, not a database\n")
    before = path.read_bytes()
    message = {"foreign": "is a SQLite database of something else (tables: measurements)",
               "damaged": "damaged SQLite file", "text": "is not a SQLite file"}[storage]
    refused(capsys, ["search", chain, "--trials", "1", "--ratios", "0.5,1.0", "--storage", path], str(path), message)
    assert path.read_bytes() == before


def test_an_unreachable_dask_scheduler_fails_fast(capsys, chain):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    refused(capsys, ["sweep", chain, "--ratios", "0.5", "--scheduler", address, "--no-cache"],
            f"--scheduler {address}: no Dask scheduler answers there")
    refused(capsys, ["variants", chain, "--scheduler", "nonsense"], "--scheduler nonsense")
    for command in (["sweep", chain, "--ratios", "0.5"], ["variants", chain], ["explain", chain, "--budget", "30"]):
        refused(capsys, [*command, "--backend", "dask", "--no-cache"] if command[0] != "explain" else
                [*command, "--backend", "dask"], "--backend dask needs --scheduler ADDRESS")


def test_typos_get_a_suggestion(capsys, chain):
    assert main(["rnu", str(chain)]) == 2
    assert "invalid choice: 'rnu' (did you mean 'run'?)" in capsys.readouterr().err
    refused(capsys, ["run", chain, "--ratio", "0.5", "--policy", "dtrr"], "unknown policy 'dtrr' (did you mean 'dtr'?)")
    refused(capsys, ["run", chain, "--ratio", "0.5", "--memory", "cachng"], "(did you mean 'caching'?)")
    refused(capsys, ["run", chain, "--ratio", "0.5", "--enforce", "allocated", "--device-capacity", "a100"],
            "argument --device-capacity: unknown device capacity 'a100' (did you mean 'A100-80GB'?)")
    assert main(["sweep", str(chain), "--backend", "lokky"]) == 2
    err = capsys.readouterr().err
    assert "argument --backend: invalid choice: 'lokky' (did you mean 'loky'?)" in err and err.count("\n") == 1
    assert main(["run", str(chain), "--ratio", "0.5", "--polcy", "dtr"]) == 2
    assert "unrecognized arguments: --polcy dtr (did you mean '--policy'?)" in capsys.readouterr().err


def test_a_bug_prints_one_line_and_keeps_the_traceback(capsys, chain, tmp_path, monkeypatch):
    from dtrlab.cli import run as run_command

    def broken(*args, **kwargs):
        raise KeyError("deliberate")

    monkeypatch.setattr(run_command, "simulate", broken)
    assert main(["run", str(chain), "--ratio", "0.5"]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError: 'deliberate'" in err
    written = tmp_path / "cache" / "errors"
    (report,) = written.iterdir()
    assert str(report) in err and "Traceback" in report.read_text() and "deliberate" in report.read_text()
    assert main(["--debug", "run", str(chain), "--ratio", "0.5"]) == 70
    assert "Traceback" in capsys.readouterr().err
    assert main(["run", str(chain), "--ratio", "0.5", "--debug"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_a_failure_after_ctrl_c_is_the_interruption(capsys, chain, monkeypatch):
    import signal

    from dtrlab.cli import run as run_command

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")

    def interrupted_library(*args, **kwargs):  # catches the Ctrl-C, then fails cleaning up (as Optuna can)
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            raise RuntimeError("cleanup failed") from None

    monkeypatch.setattr(run_command, "simulate", interrupted_library)
    assert main(["run", str(chain), "--ratio", "0.5"]) == 130
    assert capsys.readouterr().err == "dtrlab run: interrupted (RuntimeError while stopping)\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(capsys, command):
    for flag in ("--help", "-h"):
        assert main([command, flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: dtrlab {command}"), out[:200]
        # after the usage, a paragraph says what the command does (check and knob had none)
        assert not out.split("\n\n")[1].startswith(("positional arguments:", "options:")), out[:600]


def test_a_failed_run_has_no_overhead(capsys, chain):
    assert main(["run", str(chain), "--budget", "30", "--json"]) == 1
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "oom" and record["overhead"] is None
    assert main(["run", str(chain), "--budget", "40", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overhead"] == pytest.approx(7 / 6)


def test_a_closed_pipe_ends_quietly(chain, tmp_path):
    # The reader is gone before dtrlab writes: every write fails with EPIPE.
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run([sys.executable, "-m", "dtrlab", "run", str(chain), "--budget", "30", "--json",
                           "--evictions"], stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "DTRLAB_CACHE": str(tmp_path / "cache")})
    os.close(write)
    assert done.returncode == 141 and done.stderr == ""


@pytest.mark.parametrize("option", ["--layers=-2", "--batch=0", "--seq=-4", "--image=0", "--repeats=0"])
def test_capture_checks_its_numbers(capsys, tmp_path, option):
    pytest.importorskip("torch", reason="dtrlab capture needs the torch extra")
    refused(capsys, ["capture", "hf:gpt2", option, "--out", tmp_path / "x.jsonl"], f"argument {option.split('=')[0]}")
    assert not (tmp_path / "x.jsonl").exists()


def test_capture_refuses_a_directory_and_unknown_options(capsys, tmp_path):
    pytest.importorskip("torch", reason="dtrlab capture needs the torch extra")
    refused(capsys, ["capture", "unet", "--out", tmp_path], "argument --out", f"{tmp_path} is a directory")
    refused(capsys, ["capture", "--out", tmp_path / "x.jsonl", "unet", "--bacth", "2"],
            "unrecognized arguments: --bacth 2 (did you mean '--batch'?)")


def test_capture_library_checks_its_numbers():
    pytest.importorskip("torch", reason="dtrlab capture needs the torch extra")
    from dtrlab.trace.capture import capture

    with pytest.raises(ValueError, match="batch must be a whole number >= 1, got 0"):
        capture("unet", batch=0)
    with pytest.raises(ValueError, match="seq must be a whole number >= 1, got -4"):
        capture("hf:gpt2", seq=-4)
