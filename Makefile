# The commands of README.md: `make figures` (the main job), `make test` (the quick suite) and
# `make test-all` (everything, slow-marked checks included; .ci/run runs it).
# Both create an isolated environment in .venv and install dtrlab into it first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export MPLBACKEND := agg

.PHONY: setup figures test test-all bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py dtrlab/runtime/_regions.c dtrlab/runtime/_core.c dtrlab/runtime/_regions_core.h
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,torch,models,browser,solvers]'
	touch $@

figures: setup
	$(BIN)/python scripts/make_figures.py

test: setup
	$(BIN)/python -m pytest -m "not slow"

test-all: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python benchmarks/bench_replay.py

clean:
	rm -rf $(VENV) build *.egg-info dtrlab/runtime/*.so
