# The README's quick start: `make smoke` (set up, build the smoke recipe) and `make test`
# (set up, run the tests). Both work on a fresh Debian machine with Python >= 3.11.
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup harbor-env vllm-env llamafactory-env skyrl-env smoke test test-fast bench

# torch: an existing install is kept (e.g. a CUDA build on a GPU node); otherwise the pinned
# CPU-friendly release (on this project's CI machines its wheel is on local disk).
TORCH ?= torch==2.13.0
# bubblewrap: the local sandbox; python3-pytest: offline verifiers of converted Terminal-Bench
# tasks; chromium: the report's test renders it in a real headless browser
APT_PACKAGES := bubblewrap python3-pytest chromium

setup:  ## Python package + dev extras (editable), the sandbox's Debian packages, Harbor, vLLM, LLaMA-Factory and SkyRL envs, a local Slurm cluster
	@command -v bwrap >/dev/null && command -v chromium >/dev/null && /usr/bin/python3 -c "import pytest" 2>/dev/null || \
		{ $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(APT_PACKAGES); }
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "$(TORCH)"
	DS_BUILD_OPS=0 $(PYTHON) -m pip install -q -e '.[dev]'
	@scripts/podman-setup.sh  # podman for `sandbox: podman|auto`: packages, config, base images
	@scripts/harbor-env.sh || echo "setup: no Harbor environment (.venv-harbor); its tests will be skipped"
	@scripts/vllm-env.sh || echo "setup: no vLLM environment (.venv-vllm); its live and contract tests will be skipped"
	@scripts/llamafactory-env.sh || echo "setup: no LLaMA-Factory environment (.venv-llamafactory); its contract test will be skipped"
	@scripts/skyrl-env.sh || echo "setup: no SkyRL environment (.venv-skyrl); its contract test will be skipped"
	@{ scripts/slurm-cluster.sh install && scripts/slurm-cluster.sh start; } || echo "setup: no local Slurm cluster (scripts/slurm-cluster.sh); its test will be skipped"

harbor-env:  ## Harbor's CLI in .venv-harbor (Python 3.12), with otbuild for its environment class
	scripts/harbor-env.sh

vllm-env:  ## the pinned vLLM (pyproject's `vllm` extra; its CPU build without CUDA) in .venv-vllm: the `vllm` engine's default, its live and contract tests
	scripts/vllm-env.sh

llamafactory-env:  ## the pinned LLaMA-Factory (pyproject's `llamafactory` extra) in .venv-llamafactory, beside a CPU torch, for its contract test
	scripts/llamafactory-env.sh

skyrl-env:  ## the pinned SkyRL (pyproject's `skyrl` extra; config loader and Harbor dataset code, no GPU packages) in .venv-skyrl, for its contract test
	scripts/skyrl-env.sh

smoke: setup  ## build the smoke recipe: the whole DAG on the CPU
	$(PYTHON) -m snakemake smoke

test: setup  ## ruff and mypy over otbuild/, then the full suite, end-to-end (slow) checks included: what CI runs
	$(PYTHON) -m ruff check otbuild
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest

test-fast: setup  ## ruff and mypy, then the suite without the slow end-to-end checks
	$(PYTHON) -m ruff check otbuild
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest -m "not slow"

# every script in bench/ but tracegen.py (the trace generator scale.py uses); each runs in the
# test suite at a small size (tests/test_bench_*.py)
bench: setup  ## every benchmark: table stages vs pandas, decontamination vs Python, sandbox vs Harbor, trials/s against concurrency, SFT vs TRL, SFT data prep (1 vs 2 workers), LLM-stage merge, tracking, the trace path at scale, rollouts against vLLM's ceiling, RL weight sync (restart vs in place)
	$(PYTHON) bench/tables.py
	$(PYTHON) bench/decontaminate.py
	$(PYTHON) bench/sandbox.py
	$(PYTHON) bench/concurrency.py
	$(PYTHON) bench/sft.py
	$(PYTHON) bench/sft_data.py
	$(PYTHON) bench/llm_stages.py
	$(PYTHON) bench/tracking.py
	$(PYTHON) bench/scale.py
	$(PYTHON) bench/vllm.py
	$(PYTHON) bench/rl.py
