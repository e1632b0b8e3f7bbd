# The README's quick start: `make smoke` (set up, build the smoke recipe) and `make test`
# (set up, run the tests). Both work on a fresh Debian machine with Python >= 3.11.
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# the suite on both of CI's cores, a file (or every reader of the session's smoke build) per worker at a time,
# longest first (tests/conftest.py); WORKERS=1 runs it in one process
WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter 1,$(WORKERS)),,-n $(WORKERS) --dist loadgroup --no-loadscope-reorder)

.PHONY: setup-smoke setup podman slurm harbor-env agents-env vllm-env llamafactory-env skyrl-env smoke test test-fast bench

# torch: an existing install is kept (e.g. a CUDA build on a GPU node); otherwise the pinned
# CPU-friendly release (on this project's CI machines its wheel is on local disk).
TORCH ?= torch==2.13.0
# Set-up by need: `make smoke` installs what the smoke build uses and nothing else; `make test`
# (through `make setup`) adds what the test suite meets. Each step is skipped when already done.
# bubblewrap: the local sandbox; python3-pytest: offline verifiers of converted Terminal-Bench
# tasks; chromium: the report's test renders it in a real headless browser
SMOKE_APT := bubblewrap
TEST_APT := python3-pytest chromium
# the package's extras: `train` for the smoke; `make setup` (and so `make test`) sets `dev` (train,
# the benches' baselines, the test tools) for its setup-smoke step: one pip install either way
EXTRAS := train
setup: EXTRAS := dev

setup-smoke:  ## what the smoke build uses: bubblewrap, torch, the package with its `train` extra, vLLM's CPU build (~3 min fresh)
	@command -v bwrap >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(SMOKE_APT); }
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "$(TORCH)"
	DS_BUILD_OPS=0 $(PYTHON) -m pip install -q -e '.[$(EXTRAS)]'
	@scripts/vllm-env.sh || echo "setup: no vLLM environment (.venv-vllm); the smoke serves its student with otbuild serve, the live vLLM tests are skipped"

setup: setup-smoke  ## everything the tests meet: dev extras, podman and base images, Harbor and its third-party agents, LLaMA-Factory and SkyRL envs, a local Slurm cluster (~14 min fresh)
	@command -v chromium >/dev/null && /usr/bin/python3 -c "import pytest" 2>/dev/null || \
		{ $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(TEST_APT); }
	@scripts/podman-setup.sh
	@scripts/harbor-env.sh || echo "setup: no Harbor environment (.venv-harbor); its tests will be skipped"
	@scripts/agents-env.sh || echo "setup: no third-party agents (.venv-agents); the mini-swe-agent test will be skipped"
	@scripts/llamafactory-env.sh || echo "setup: no LLaMA-Factory environment (.venv-llamafactory); its contract test will be skipped"
	@scripts/skyrl-env.sh || echo "setup: no SkyRL environment (.venv-skyrl); its contract test will be skipped"
	@$(MAKE) -s slurm || echo "setup: no local Slurm cluster (scripts/slurm-cluster.sh); its test will be skipped"

podman:  ## podman for `sandbox: podman|auto`: packages, configuration, the base images bootstrapped from the archives
	scripts/podman-setup.sh

slurm:  ## a single-host Slurm cluster for the tests (munge, slurmdbd, slurmctld, 4 fake GPU nodes), started
	scripts/slurm-cluster.sh install && scripts/slurm-cluster.sh start

harbor-env:  ## Harbor's CLI in .venv-harbor (Python 3.12), with otbuild for its environment class
	scripts/harbor-env.sh

agents-env:  ## third-party agents Harbor runs inside otbuild's sandbox (mini-swe-agent), in .venv-agents/ on the host's /usr/bin/python3 (~2 min fresh)
	scripts/agents-env.sh

vllm-env:  ## the pinned vLLM (pyproject's `vllm` extra; its CPU build without CUDA) in .venv-vllm: the `vllm` engine's default, its live and contract tests
	scripts/vllm-env.sh

llamafactory-env:  ## the pinned LLaMA-Factory (pyproject's `llamafactory` extra) in .venv-llamafactory, beside a CPU torch, for its contract test
	scripts/llamafactory-env.sh

skyrl-env:  ## the pinned SkyRL (pyproject's `skyrl` extra; config loader and Harbor dataset code, no GPU packages) in .venv-skyrl, for its contract test
	scripts/skyrl-env.sh

smoke: setup-smoke  ## build the smoke recipe: the whole DAG on the CPU
	$(PYTHON) -m snakemake smoke

test: setup  ## ruff (lint over otbuild/, format over all the code) and mypy, then the full suite, end-to-end (slow) checks included: what CI runs
	$(PYTHON) -m ruff check otbuild
	$(PYTHON) -m ruff format --check otbuild tests bench scripts
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest $(PYTEST_PARALLEL)

test-fast: setup  ## ruff (lint and format) and mypy, then the suite without the slow end-to-end checks
	$(PYTHON) -m ruff check otbuild
	$(PYTHON) -m ruff format --check otbuild tests bench scripts
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest $(PYTEST_PARALLEL) -m "not slow"

# every script in bench/ but tracegen.py (the trace generator scale.py uses); each runs in the
# test suite at a small size (tests/bench/test_*.py)
bench: setup  ## every benchmark: table stages vs pandas, decontamination vs Python, near-dedup vs exact dedup, sandbox vs Harbor, trials/s against concurrency, SFT vs TRL, SFT data prep (1 vs 2 workers), LLM-stage merge, tracking, the trace path at scale, rollouts against vLLM's ceiling, RL weight sync (restart vs in place)
	$(PYTHON) bench/tables.py
	$(PYTHON) bench/decontaminate.py
	$(PYTHON) bench/near_dedup.py
	$(PYTHON) bench/sandbox.py
	$(PYTHON) bench/concurrency.py
	$(PYTHON) bench/sft.py
	$(PYTHON) bench/sft_data.py
	$(PYTHON) bench/llm_stages.py
	$(PYTHON) bench/tracking.py
	$(PYTHON) bench/scale.py
	$(PYTHON) bench/vllm.py
	$(PYTHON) bench/rl.py
