# The README's quick start: `make smoke` (set up, build the smoke recipe) and `make test`
# (set up, run the tests). Both work on a fresh Debian machine with Python >= 3.11.
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup smoke test test-fast bench

# torch: an existing install is kept (e.g. a CUDA build on a GPU node); otherwise the pinned
# CPU-friendly release (on this project's CI machines its wheel is on local disk).
TORCH ?= torch==2.13.0

setup:  ## Python package + dev extras (editable), and bubblewrap for sandboxed tasks
	@command -v bwrap >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq bubblewrap; }
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "$(TORCH)"
	$(PYTHON) -m pip install -q -e '.[dev]'

smoke: setup  ## build the smoke recipe: the whole DAG on the CPU
	$(PYTHON) -m snakemake smoke

test: setup  ## the full suite, end-to-end (slow) checks included: what CI runs
	$(PYTHON) -m pytest

test-fast: setup  ## skip the slow end-to-end checks
	$(PYTHON) -m pytest -m "not slow"

bench: setup  ## table stages: DuckDB vs pandas on 1M task rows
	$(PYTHON) bench/tables.py
