"""Mutation testing (``make mutate``): mutmut on the modules where a wrong answer is silent, module by module.

    .venv/bin/python scripts/mutate.py                          # every module in MODULES
    .venv/bin/python scripts/mutate.py dtrlab/runtime/semantics.py --jobs 2
    .venv/bin/python scripts/mutate.py --scores                 # the last runs' scores, without running

Each module runs in its own scratch directory, build/mutate/<module>/ (its own mutmut configuration:
the module alone mutated, the quick tests of the files that cover it selected), so one module's run
never waits on another's tests and a module can be rerun alone. mutmut forks each mutant from its
fork server, a process that has imported the tests but run none (torch's autograd refuses a backward
in a process forked after one), and runs only the tests that reached the mutated function: quickest
first, each failed past 20 x its time in mutmut's stats run + 10 s (tests/conftest.py, under
``DTRLAB_MUTATE``, which this script sets), so that a mutant a quick test kills, or a loop it enters,
costs seconds instead of the slowest tests or mutmut's own limit of minutes. Prints, per module,
killed / survived / timeout / no tests / total and the share killed, and writes build/mutate/scores.json.
Survivors: ``cd build/mutate/<module> && mutmut show NAME``.
Not in CI: it takes hours (docs/reproduce.md gives each module's cost and score).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / "build" / "mutate"
#: Each module and the test files that cover it (their quick tests run against its mutants).
MODULES = {
    "dtrlab/analysis/check.py": ["tests/test_check.py", "tests/test_check_knob.py"],
    # The same crash (below) during the tests whose census runs on fork or loky worker processes.
    "dtrlab/analysis/knob_census.py": ["tests/test_knob_census.py", "--deselect=tests/test_knob_census.py::"
                                       "test_worker_processes_give_the_same_census", "--deselect=tests/"
                                       "test_knob_census.py::test_a_failing_evaluation_in_a_worker_is_raised_here"],
    "dtrlab/analysis/holes.py": ["tests/test_holes.py", "tests/test_census_guarantee.py"],
    "dtrlab/analysis/anatomy.py": ["tests/test_anatomy.py"],
    # With test_inductor's quick tests: the Inductor accounting's path through both (joints traced for Inductor,
    # graph breaks, knob_peaks's backend); test_user_corpus's: a step with graph breaks under aot_eager. The same
    # tests for the five modules that were partition.py's with it (the joint trace, its graph breaks, the recording).
    **{f"dtrlab/trace/torch_compile/{name}.py": ["tests/test_partition.py", "tests/test_inductor.py",
                                                 "tests/test_user_corpus.py"]
       for name in ("tracing", "intercept", "graph_breaks", "joint", "partition", "record")},
    "dtrlab/memory/partitioned.py": ["tests/test_partition.py", "tests/test_inductor.py"],
    "dtrlab/memory/caching.py": ["tests/test_memory_models.py", "tests/test_memory_core.py"],
    "dtrlab/runtime/semantics.py": ["tests/test_memory_semantics.py", "tests/test_memory_runtime.py",
                                    "tests/test_values.py"],
    # mutmut 3.8.1 crashed (KeyError in its wait_for_result) during the test that starts two worker processes.
    "dtrlab/calibrated/monotone.py": ["tests/test_monotone.py", "--deselect=tests/test_monotone.py::"
                                     "test_zero_holes_and_non_increasing_overhead_at_0001_with_two_workers"],
    "dtrlab/solvers/replay.py": ["tests/test_solvers.py"],
    # Not test_fit_knob's tests of dtrlab.compile's cache by fingerprint: they compile (seconds each), and a mutant that
    # makes two steps' keys differ sends them searching past mutmut's limit, a timeout whether or not a test failed.
    "dtrlab/trace/torch_compile/fingerprint.py": ["tests/test_fingerprint.py",
                                    "tests/test_fit_knob.py::test_step_fingerprint_sees_what_decides_the_graph"],
    # The Inductor accounting and the byte budget: their quick tests trace and lower small models (tens of seconds
    # a test), so a run takes hours.
    "dtrlab/trace/torch_compile/inductor.py": ["tests/test_inductor.py"],
    "dtrlab/analysis/fit_knob.py": ["tests/test_fit_knob.py"],
    "dtrlab/analysis/knob_compile.py": ["tests/test_fit_knob.py"],
}
#: What the tests read besides the package (mutmut copies them beside the mutated package).
ALSO_COPY = ["tests", "traces", "results/shipped", "results/frontier", "scripts", "pyproject.toml"]
RESULTS = ("killed", "survived", "timeout", "no_tests", "suspicious", "segfault", "skipped", "total")


def configuration(module: str, tests: list[str]) -> str:
    """The scratch directory's pyproject.toml: mutmut's settings for ``module`` and pytest's own settings."""
    def toml_list(items):
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"
    return (f"[tool.mutmut]\nsource_paths = [\"dtrlab\"]\nonly_mutate = {toml_list([module])}\n"
            f"also_copy = {toml_list(ALSO_COPY)}\n"
            f"pytest_add_cli_args = {toml_list(['-m', 'not slow', '-p', 'no:random_order', '-p', 'no:cacheprovider'])}\n"
            f"pytest_add_cli_args_test_selection = {toml_list(tests)}\n"
            # A mutant that loops (a bisection that never ends) is stopped after 2 x 3 x (its tests' CPU time + 10 s) of
            # CPU, or half that of wall time (mutmut's default multiplier, 15, let one hold a module's run for minutes on
            # busy cores); it counts as killed. The 10 s (mutmut's default: 1 s) cover the forked pytest's own start:
            # on busy cores it took more than the 3 s of wall time that 1 s gave a mutant whose tests take 0.02 s, so
            # such mutants were "timeouts" whether their tests failed or passed (trace/torch_compile/fingerprint.py's
            # first run).
            "timeout_multiplier = 3.0\ntimeout_constant = 10.0\n"
            # Each mutant's tests in a process forked from mutmut's fork server, which has imported the tests but run
            # none: torch's autograd refuses a backward in a process forked after one ran a backward, so under mutmut's
            # default (forked from the process that ran the stats run) every test running a step failed, whatever the
            # mutant (docs/reproduce.md).
            "process_isolation = \"forkserver\"\n"
            "use_git_change_detection = false\n\n"
            "[tool.pytest.ini_options]\ntestpaths = [\"tests\"]\n"
            "markers = [\"slow: long reference checks\", \"shared: needs ../shared\"]\n")


def scratch_for(module: str) -> Path:
    return SCRATCH / module.removesuffix(".py").replace("/", ".")


def prepare(module: str) -> Path:
    """A fresh scratch directory for ``module``: links to what mutmut copies, and the configuration."""
    directory = scratch_for(module)
    if directory.exists():
        subprocess.run(["rm", "-rf", str(directory)], check=True)
    directory.mkdir(parents=True)
    for name in ["dtrlab", *ALSO_COPY[:-1]]:
        link = directory / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT / name)
    (directory / "pyproject.toml").write_text(configuration(module, MODULES[module]))
    return directory


def scores(module: str) -> dict | None:
    """The last run's counts for ``module`` (mutmut's export-cicd-stats), or None when it has not run."""
    directory = scratch_for(module)
    if not (directory / "mutants").exists():
        return None
    subprocess.run([sys.executable, "-m", "mutmut", "export-cicd-stats"], cwd=directory, capture_output=True)
    path = directory / "mutants" / "mutmut-cicd-stats.json"
    if not path.exists():
        return None
    counts = json.loads(path.read_text())
    record = {key: counts.get(key, 0) for key in RESULTS}
    tested = record["total"] - record["no_tests"] - record["skipped"]
    record["killed_share"] = round((record["killed"] + record["timeout"]) / tested, 4) if tested else None
    return record


def run(module: str, jobs: int) -> dict:
    directory = prepare(module)
    started = time.perf_counter()
    # One OpenMP thread: mutmut forks each mutant's tests from a process that has run torch, and a fork after torch
    # ran a parallel region can hang in the next one (trace/torch_compile/fingerprint.py's first run: a model's
    # .double() did).
    result = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)], cwd=directory,
                            env={**os.environ, "PYTHONPATH": "", "DTRLAB_RECOMPUTE": "1", "DTRLAB_MUTATE": "1",
                                 "OMP_NUM_THREADS": "1"})
    # A failed run (its clean or stats run of the tests failed) scores nothing: mutmut says why above.
    record = (scores(module) or {}) if result.returncode == 0 else {"killed_share": None}
    record.update(module=module, tests=MODULES[module], seconds=round(time.perf_counter() - started),
                  exit_code=result.returncode)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="mutation testing, module by module (mutmut)")
    parser.add_argument("modules", nargs="*", help=f"modules to mutate (default: all {len(MODULES)})")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    parser.add_argument("--scores", action="store_true", help="print the last runs' scores, run nothing")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"not a module of make mutate: {', '.join(unknown)} (one of: {', '.join(MODULES)})")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    SCRATCH.mkdir(parents=True, exist_ok=True)
    table_path = SCRATCH / "scores.json"
    table = json.loads(table_path.read_text()) if table_path.exists() else {}
    for module in args.modules or list(MODULES):
        if args.scores:
            table[module] = {**table.get(module, {}), **(scores(module) or {})}
        else:
            table[module] = run(module, args.jobs)
        table_path.write_text(json.dumps(table, indent=1) + "\n")
        record = table[module]
        print(f"{module}: " + ", ".join(f"{key} {record.get(key)}" for key in (*RESULTS, "killed_share", "seconds")),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
