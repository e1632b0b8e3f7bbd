#!/usr/bin/env bash
# Create .venv-llamafactory/: the LLaMA-Factory release otbuild's handoff is tested against (the
# `llamafactory` extra in pyproject.toml, the one pin) in an environment of its own, beside a
# CPU torch (LLaMA-Factory pins its own transformers, datasets and peft, kept out of otbuild's).
# tests/contracts/test_llamafactory.py parses the exported YAML with LLaMA-Factory's argument
# parser and loads the exported dataset with its own template code; no GPU needed.
# A few minutes the first time, nothing after (scripts/pinned-env.sh: the cache, the link).
# Env: LLAMAFACTORY_PYTHON (a python3 >= 3.11), LLAMAFACTORY_VENV (default: the cache dir),
# TORCH (default torch==2.13.0, the CPU build make setup installs), TORCH_INDEX (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pinned-env.sh

pinned_env llamafactory cpu_torch
