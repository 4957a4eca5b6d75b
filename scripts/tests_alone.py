"""Run each test file alone, in its own pytest process, in file order (part of ``make test-all``).

    .venv/bin/python scripts/tests_alone.py                 # the quick tests of every tests/test_*.py
    .venv/bin/python scripts/tests_alone.py -m "" tests/test_check.py

A test that passes in the full run only because another file ran first (an import, a cache, a
configuration it left behind) fails here. Prints each file's result and seconds, then the files
that failed; exits 1 if any did. Extra pytest options after ``--``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
NO_TESTS_COLLECTED = 5  # pytest's exit code when a file holds only deselected (slow) tests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run each test file alone")
    parser.add_argument("files", nargs="*", type=Path, help="test files (default: every tests/test_*.py)")
    parser.add_argument("-m", "--marks", default="not slow", help="pytest -m expression (default: 'not slow')")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: more pytest options")
    args = parser.parse_args(argv)
    files = args.files or sorted(TESTS.glob("test_*.py"))
    extra = [a for a in args.pytest_args if a != "--"]
    failed, started = [], time.perf_counter()
    for path in files:
        if not path.exists():
            parser.error(f"no test file {path}")
        began = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:random_order", "-p", "no:cacheprovider",
                              *(["-m", args.marks] if args.marks else []), *extra, str(path)],
                             capture_output=True, text=True)
        passed = run.returncode in (0, NO_TESTS_COLLECTED)
        last = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"{'ok  ' if passed else 'FAIL'} {path.name}: {last} ({time.perf_counter() - began:.0f} s)", flush=True)
        if not passed:
            failed.append(path.name)
            print(run.stdout[-4000:] + run.stderr[-2000:], flush=True)
    print(f"{len(files)} files alone in {time.perf_counter() - started:.0f} s; "
          + (f"failed alone: {' '.join(failed)}" if failed else "each passed alone"))
    print(f"files: {len(files) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
