"""Run each test file alone, in its own pytest process, the longest first (part of ``make test-all``).

    .venv/bin/python scripts/tests_alone.py                 # the quick tests of every tests/test_*.py
    .venv/bin/python scripts/tests_alone.py -m "" tests/test_check.py
    .venv/bin/python scripts/tests_alone.py --jobs 2        # two files at a time (make test-all)

A test that passes in the full run only because another file ran first (an import, a cache, a
configuration it left behind) fails here. Prints each file's result and seconds as it ends, then the
files that failed; exits 1 if any did. Extra pytest options after ``--``.

Each file's process is forked from this one after it has imported torch, Inductor and pytest
(:data:`PRELOADED`), and nothing of dtrlab or of the tests: what each file would otherwise import afresh, a few
seconds of CPU a file. Those imports run no kernel, so no OpenMP thread pool exists when it forks (a pool started
before a fork leaves the child's first parallel region waiting forever, docs/compile.md "Executors").
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
NO_TESTS_COLLECTED = 5  # pytest's exit code when a file holds only deselected (slow) tests
#: Imported once, before the forks: third-party modules that start no thread pool a fork would break (numpy's
#: OpenBLAS starts its workers at import and re-creates them in a child, by its own fork handler).
#: Not pytest's plugins (hypothesis, xdist): imported before pytest starts, they could not be assertion-rewritten.
PRELOADED = ("torch", "torch._dynamo", "torch._inductor.compile_fx", "pytest")


def file_seconds() -> dict[str, dict[str, int]]:
    """Each test file's measured seconds (tests/file_seconds.json): ``slow`` (its slow tests under ``-n 2``, which
    tests/conftest.py's ``--heaviest-files-first`` reads) and ``alone`` (its quick tests alone)."""
    return json.loads((TESTS / "file_seconds.json").read_text())


def longest_first(files: list[Path]) -> list[Path]:
    """``files`` in the order of their measured seconds alone, longest first, so that no long file starts when the
    other jobs are nearly done; files not measured last, in their order."""
    seconds = file_seconds()["alone"]
    return sorted(files, key=lambda path: -seconds.get(path.name, 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run each test file alone")
    parser.add_argument("files", nargs="*", type=Path, help="test files (default: every tests/test_*.py)")
    parser.add_argument("-m", "--marks", default="not slow", help="pytest -m expression (default: 'not slow')")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="files run at once (default 1)")
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    files = args.files or longest_first(sorted(TESTS.glob("test_*.py")))
    missing = [str(path) for path in files if not path.exists()]
    if missing:
        parser.error(f"no test file {missing[0]}")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give at least 1")
    options = ["-q", "-p", "no:random_order", "-p", "no:cacheprovider",
               *(["-m", args.marks] if args.marks else []), *extra]
    for name in PRELOADED:
        importlib.import_module(name)
    failed, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tests-alone-") as logs:
        for path, code, output, seconds in forked_runs(files, options, args.jobs, Path(logs)):
            passed = code in (0, NO_TESTS_COLLECTED)
            last = (output.strip().splitlines() or ["(no output)"])[-1]
            print(f"{'ok  ' if passed else 'FAIL'} {path.name}: {last} ({seconds:.0f} s)", flush=True)
            if not passed:
                failed.append(path.name)
                print(output[-6000:], flush=True)
    print(f"{len(files)} files alone in {time.perf_counter() - started:.0f} s; "
          + (f"failed alone: {' '.join(failed)}" if failed else "each passed alone"))
    print(f"files: {len(files) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def forked_runs(files: list[Path], options: list[str], jobs: int, logs: Path):
    """Runs pytest on each file in a child forked from this process, ``jobs`` at a time, and yields each file's
    ``(path, exit code, output, seconds)`` as its child ends. One thread only: a fork from a process with other
    threads could copy a lock one of them held."""
    waiting, running = list(files), {}
    while waiting or running:
        while waiting and len(running) < jobs:
            path = waiting.pop(0)
            log = logs / f"{path.stem}.log"
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _run_in_child(path, options, log)
            running[pid] = (path, log, time.perf_counter())
        pid, status = os.wait()
        path, log, began = running.pop(pid)
        yield path, os.waitstatus_to_exitcode(status), log.read_text(errors="replace"), time.perf_counter() - began


def _run_in_child(path: Path, options: list[str], log: Path) -> None:
    """The child: its output to ``log``, pytest on the file (pyproject.toml's ``pythonpath`` puts the repository's
    root first on sys.path, as ``python -m pytest`` puts the working directory); never returns. ``os._exit`` runs no
    ``atexit`` handler, so the cache folder tests/conftest.py makes for its run (and removes at exit) is removed here:
    a file-alone run left one in the temporary folder for each test file."""
    code = 70  # EX_SOFTWARE: pytest itself raised
    inherited_cache = os.environ.get("DTRLAB_CACHE")
    try:
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        import pytest

        code = int(pytest.main([*options, str(path)]))
    except BaseException:  # noqa: BLE001 -- the child must reach os._exit whatever happened
        import traceback

        traceback.print_exc()
    finally:
        if os.environ.get("DTRLAB_CACHE") != inherited_cache:
            shutil.rmtree(os.environ["DTRLAB_CACHE"], ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
