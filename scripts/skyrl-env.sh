#!/usr/bin/env bash
# Create .venv-skyrl/: the SkyRL release otbuild's `rl.trainer: skyrl` handoff is tested against
# (the `skyrl` extra in pyproject.toml, the one pin) in an environment of its own, beside a CPU
# torch: SkyRL with its base dependencies and, of its `skyrl-train` extra, only what its config
# loader (SkyRLTrainConfig, validate_cfg) and trainer modules import; no vLLM, flash-attn or CUDA.
# SkyRL's Harbor integration (examples/train_integrations/harbor: the entry point, its config
# class and HarborTaskDataset) is not in the PyPI release: it is copied from SkyRL's git tag
# skyrl-vVERSION into .venv-skyrl/skyrl-src/, from SKYRL_GIT (a clone, mirror or URL of SkyRL's repo)
# when set, else the bundle of that folder in ../shared/data/skyrl/ (offline) when there, else GitHub.
# tests/contracts/test_skyrl.py runs that code on what otbuild writes; no GPU needed.
# A few minutes the first time, nothing after (scripts/pinned-env.sh: the cache, the link).
# Env: SKYRL_PYTHON (a python3 >= 3.11), SKYRL_VENV, SKYRL_GIT, TORCH, TORCH_INDEX.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pinned-env.sh

# What SkyRL's trainer modules import beyond its base dependencies (its `skyrl-train` extra,
# minus the GPU-only packages), at the versions that extra pins where it pins them.
skyrl_train_deps() {
    "$1/bin/python" -m pip install -q --disable-pip-version-check "skyrl-gym==0.4.0" "ray==2.56.0" omegaconf \
        loguru pydantic torchdata jaxtyping aiohttp httpx tqdm pyarrow 2>&1 | grep -v "^WARNING: Location" || true
}

pinned_env skyrl cpu_torch skyrl_train_deps

src=.venv-skyrl/skyrl-src
harbor=examples/train_integrations/harbor
version=$(.venv-skyrl/bin/python -c "from importlib.metadata import version; print(version('skyrl'))")
if [ ! -f "$src/$harbor/dataset.py" ] || [ "$(cat "$src/TAG" 2>/dev/null)" != "skyrl-v$version" ]; then
    bundle="../shared/data/skyrl/skyrl-v$version-harbor.bundle"
    if [ -n "${SKYRL_GIT:-}" ]; then repo=$SKYRL_GIT
    elif [ -f "$bundle" ]; then repo=$(realpath "$bundle")
    else repo=https://github.com/NovaSky-AI/SkyRL; fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # only that folder is checked out (a blobless clone fetches nothing else)
    { git clone -q --no-checkout --filter=blob:none --depth 1 --branch "skyrl-v$version" "$repo" "$tmp/skyrl" 2>&1 \
      | grep -v "^warning: --[a-z]* is ignored" || true
      git -C "$tmp/skyrl" -c advice.detachedHead=false checkout -q "skyrl-v$version" -- "$harbor"; } || {
        echo "skyrl-env: could not clone tag skyrl-v$version of $repo (set SKYRL_GIT to a clone or mirror);" \
             "SkyRL's Harbor integration is missing, its contract test will be skipped" >&2; exit 3; }
    rm -rf "$src" && mkdir -p "$src/$harbor"
    cp -r "$tmp/skyrl/$harbor/." "$src/$harbor/"
    echo "skyrl-v$version" > "$src/TAG"
    echo "skyrl-env: SkyRL's Harbor integration (tag skyrl-v$version) in $src"
fi
