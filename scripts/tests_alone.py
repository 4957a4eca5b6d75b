"""Run each test file alone, in its own pytest process, the longest first (part of ``make test-all``).

    .venv/bin/python scripts/tests_alone.py                 # the quick tests of every tests/test_*.py
    .venv/bin/python scripts/tests_alone.py -m "" tests/test_check.py
    .venv/bin/python scripts/tests_alone.py --jobs 2        # two files at a time (make test-all)

A test that passes in the full run only because another file ran first (an import, a cache, a
configuration it left behind) fails here. Prints each file's result and seconds as it ends, then the
files that failed; exits 1 if any did. Extra pytest options after ``--``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
NO_TESTS_COLLECTED = 5  # pytest's exit code when a file holds only deselected (slow) tests


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
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:random_order", "-p", "no:cacheprovider",
               *(["-m", args.marks] if args.marks else []), *extra]

    def alone(path: Path):
        began = time.perf_counter()
        run = subprocess.run([*command, str(path)], capture_output=True, text=True)
        return path, run, time.perf_counter() - began

    failed, started = [], time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:  # threads only wait on the pytest processes
        for path, run, seconds in (future.result() for future in
                                   concurrent.futures.as_completed([pool.submit(alone, p) for p in files])):
            passed = run.returncode in (0, NO_TESTS_COLLECTED)
            last = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"{'ok  ' if passed else 'FAIL'} {path.name}: {last} ({seconds:.0f} s)", flush=True)
            if not passed:
                failed.append(path.name)
                print(run.stdout[-4000:] + run.stderr[-2000:], flush=True)
    print(f"{len(files)} files alone in {time.perf_counter() - started:.0f} s; "
          + (f"failed alone: {' '.join(failed)}" if failed else "each passed alone"))
    print(f"files: {len(files) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
