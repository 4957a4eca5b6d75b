"""The `dtrlab info` and `dtrlab run` commands, and how the CLI reports bad input."""

import json

from dtrlab.cli import main
from test_handbuilt import chain_log


def write_chain(tmp_path):
    path = tmp_path / "chain.log"
    chain_log().write(path)
    return path


def test_run_prints_the_record_as_json(tmp_path, capsys):
    path = write_chain(tmp_path)
    assert main(["run", str(path), "--budget", "30", "--json", "--evictions"]) == 1  # a failed run exits 1
    record = json.loads(capsys.readouterr().out)
    assert (record["status"], record["clock"], record["evicted_storages"]) == ("oom", 10, ["a", "b", "c"])
    assert main(["run", str(path), "--ratio", "1.0"]) == 0
    assert "status" in capsys.readouterr().out


def test_info_reports_counts_and_baseline(tmp_path, capsys):
    path = write_chain(tmp_path)
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["operators"], info["tensors"], info["baseline_peak_bytes"], info["baseline_compute"]) == (4, 4, 40, 6)


def test_bad_input_gets_a_clear_message(tmp_path, capsys):
    path = write_chain(tmp_path)
    assert main(["run", str(path), "--ratio", "0.5", "--policy", "nope"]) == 2
    error = capsys.readouterr().err
    assert "unknown policy 'nope'; available: " in error and " dtr, " in error and "twophase" in error
    assert main(["run", str(path), "--ratio", "-1"]) == 2
    assert "argument --ratio: must be positive, got '-1'" in capsys.readouterr().err
    broken = tmp_path / "broken.log"
    broken.write_text('{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}\n{"INSTRUCTION":"COPY","DST":"a","SRC":"b"}\n')
    assert main(["info", str(broken)]) == 2
    assert f"{broken}:2: reference to undefined tensor 'b'" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.log"), "--ratio", "0.5"]) == 2
    assert "no log file at" in capsys.readouterr().err
