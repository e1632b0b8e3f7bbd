#!/usr/bin/env bash
# Create .venv-vllm/: the vLLM release otbuild is tested against (the `vllm` extra in
# pyproject.toml, the one pin) in an environment of its own: it brings a CUDA torch and its
# CUDA libraries (~9 GB), kept out of otbuild's. tests/test_vllm_contract.py checks otbuild's
# `vllm serve` command lines and request bodies against its code; no GPU needed.
# ~6-10 minutes the first time, nothing after (scripts/pinned-env.sh: the cache, the link).
# Env: VLLM_PYTHON (a python3 >= 3.11 for the environment), VLLM_VENV (default: the cache dir).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pinned-env.sh
pinned_env vllm
