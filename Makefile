# The commands of README.md: `make figures` (the main job), `make test` (the quick suite),
# `make test-all` (everything, slow-marked checks included; .ci/run runs it) and `make lab`
# (JupyterLab on 127.0.0.1 with the notebooks; `make lab PORT=9000`), and `make docs` (the site).
# Each creates an isolated environment in .venv and installs dtrlab into it first, every pip install under
# constraints.txt (the exact versions that draw the committed figures byte for byte).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8888
export MPLBACKEND := agg

.PHONY: setup figures test test-all mutate lab docs bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt setup.py dtrlab/trace/_logparse.c dtrlab/runtime/_regions.c dtrlab/runtime/_core.c dtrlab/runtime/_regions_core.h dtrlab/policies/_policy_spec.h dtrlab/policies/_policy_core.h dtrlab/memory/_memory_core.h dtrlab/memory/_compiled.c dtrlab/_pytype.h
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,torch,models,browser,solvers,planner,docs]'
	touch $@

figures: setup
	$(BIN)/dtrlab figures

# test runs the quick suite (every test not marked slow) on TEST_JOBS processes, a whole file to each at a time.
TEST_JOBS ?= 2
test: setup
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_JOBS) --dist loadfile

# test-all runs every test: the quick suite in a random order (a fixed seed, printed; SEED=N for another: the files
# shuffled and each file's tests shuffled, each worker running its files in that order), the slow-marked checks
# (the longest files handed out first, tests/file_seconds.json), then each test file's quick tests alone in its own
# process: a test that needs another to run first, or that leaves state behind, fails one of them. Each runs
# TEST_JOBS processes at once (a whole file to a process, by pytest-xdist), since no test reads the machine's speed.
SEED ?= 45
test-all: setup
	$(BIN)/python -m pytest -m "not slow" -p random_order --random-order-bucket=module --random-order-seed=$(SEED) \
		-n $(TEST_JOBS) --dist loadfile
	$(BIN)/python -m pytest -m slow -n $(TEST_JOBS) --dist loadfile --heaviest-files-first
	$(BIN)/python scripts/tests_alone.py --jobs $(TEST_JOBS)

# Mutation testing (mutmut, the `mutate` extra) of the modules where a wrong answer is silent, each against the
# quick tests of the files that cover it (scripts/mutate.py). Hours, so not in test-all: run it after changing one
# of those modules, e.g. `make mutate MODULES=dtrlab/analysis/check.py` (docs/reproduce.md lists the scores).
MODULES ?=
JOBS ?= 2
mutate: $(VENV)/.mutate
	$(BIN)/python scripts/mutate.py --jobs $(JOBS) $(MODULES)

$(VENV)/.mutate: $(VENV)/.installed pyproject.toml constraints.txt
	$(BIN)/pip install --quiet -c constraints.txt -e '.[mutate]'
	touch $@

lab: setup
	$(BIN)/python scripts/lab.py --port $(PORT)

# The documentation (docs/*.md and the figures) as a static site in site/, offline (mkdocs.yml).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

bench: setup
	$(BIN)/python benchmarks/bench_replay.py

clean:
	rm -rf $(VENV) build site *.egg-info dtrlab/runtime/*.so dtrlab/trace/*.so
