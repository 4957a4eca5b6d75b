"""make test-all hands the longest test files out first (tests/file_seconds.json): the slow run's pytest-xdist
workers by ``--heaviest-files-first``, the file-alone run by scripts/tests_alone.py. Only the order changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import FILE_SECONDS, ROOT, load_script

TESTS = ROOT / "tests"


def test_every_measured_file_exists():
    """A renamed or removed file's entry would order nothing: the table names only files that are there."""
    for section in ("slow", "alone"):
        assert FILE_SECONDS[section], section
        assert sorted(name for name in FILE_SECONDS[section] if not (TESTS / name).is_file()) == [], section


def _tests_alone_script():
    return load_script("tests_alone")


def test_the_file_alone_run_starts_with_the_longest_files():
    files = sorted(TESTS.glob("test_*.py"))
    ordered = _tests_alone_script().longest_first(files)
    assert sorted(ordered) == files  # every file, once
    seconds = [FILE_SECONDS["alone"].get(path.name, 0) for path in ordered]
    assert seconds == sorted(seconds, reverse=True) and seconds[0] == max(FILE_SECONDS["alone"].values())


def _collected(*options: str) -> list[str]:
    files = ["tests/test_sweep.py", "tests/test_inductor.py"]  # test_inductor's slow tests measured the longest
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", *options, *files],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_slow_run_collects_the_longest_file_first_each_files_tests_in_order():
    plain, heaviest = _collected(), _collected("--heaviest-files-first")
    assert Path(plain[0].split("::")[0]).name == "test_sweep.py"
    assert Path(heaviest[0].split("::")[0]).name == "test_inductor.py"
    assert sorted(heaviest) == sorted(plain)
    for name in ("test_sweep.py", "test_inductor.py"):  # each file's own order kept
        assert [item for item in heaviest if name in item] == [item for item in plain if name in item]


def test_the_file_alone_run_leaves_no_cache_folder_behind(tmp_path):
    """Each file's child ends by ``os._exit``, which skips tests/conftest.py's ``atexit`` removal of its cache
    folder: 79 such folders were left in the temporary folder by each ``make test-all``."""
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "scripts/tests_alone.py", "tests/test_layers.py"],
                          capture_output=True, text=True, cwd=ROOT, env=environment)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "each passed alone" in done.stdout
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("dtrlab-tests-cache-")) == []
