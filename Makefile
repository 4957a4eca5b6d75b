# The commands of README.md: `make figures` (the main job), `make test` (the quick suite),
# `make test-all` (everything, slow-marked checks included; .ci/run runs it) and `make lab`
# (JupyterLab on 127.0.0.1 with the notebooks; `make lab PORT=9000`), and `make docs` (the site).
# Each creates an isolated environment in .venv and installs dtrlab into it first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8888
export MPLBACKEND := agg

.PHONY: setup figures test test-all lab docs bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py dtrlab/trace/_logparse.c dtrlab/runtime/_regions.c dtrlab/runtime/_core.c dtrlab/runtime/_regions_core.h dtrlab/policies/_policy_spec.h dtrlab/policies/_policy_core.h dtrlab/memory/_memory_core.h dtrlab/memory/_compiled.c dtrlab/_pytype.h
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,torch,models,browser,solvers,docs]'
	touch $@

figures: setup
	$(BIN)/dtrlab figures

test: setup
	$(BIN)/python -m pytest -m "not slow"

test-all: setup
	$(BIN)/python -m pytest

lab: setup
	$(BIN)/python scripts/lab.py --port $(PORT)

# The documentation (docs/*.md and the figures) as a static site in site/, offline (mkdocs.yml).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

bench: setup
	$(BIN)/python benchmarks/bench_replay.py

clean:
	rm -rf $(VENV) build site *.egg-info dtrlab/runtime/*.so dtrlab/trace/*.so
