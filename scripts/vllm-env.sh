#!/usr/bin/env bash
# Create .venv-vllm/: the vLLM release otbuild is tested against (the `vllm` extra in
# pyproject.toml, the one pin) in an environment of its own: it brings a CUDA torch and its
# CUDA libraries (~9 GB), kept out of otbuild's. tests/test_vllm_contract.py checks otbuild's
# `vllm serve` command lines and request bodies against its code; no GPU needed.
# Idempotent: does nothing when the pinned vLLM is already there (~6-10 minutes when it is not).
# The environment itself lives in the user's cache, one per pinned version
# (~/.cache/otbuild/venv-vllm-VERSION), and .venv-vllm links to it: every clone on a machine
# (CI's included) shares one install.
# Env: VLLM_PYTHON (a python3 >= 3.11 for the environment), VLLM_VENV (default: that cache dir).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${VLLM_PYTHON:-python3}"
PIN=$("$PY" - <<'PY'
import tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm"]
print(next(r for r in extra if r.replace(" ", "").startswith("vllm==")).replace(" ", ""))
PY
)
VERSION="${PIN#vllm==}"
VENV="${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/otbuild/venv-vllm-$VERSION}"
link() { [ "$VENV" -ef .venv-vllm ] || ln -sfn "$VENV" .venv-vllm; }

installed() { "$VENV/bin/python" -c 'from importlib.metadata import version; print(version("vllm"))' 2>/dev/null; }
if [ "$(installed)" = "$VERSION" ]; then
    link
    echo "vllm-env: $VENV has vllm $VERSION"
    exit 0
fi

echo "vllm-env: installing $PIN into $VENV (its own CUDA torch; several minutes)"
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$PIN" 2>&1 \
    | grep -v "^WARNING: Location" || true
[ "$(installed)" = "$VERSION" ] || { echo "vllm-env: $PIN did not install into $VENV" >&2; exit 1; }
link
echo "vllm-env: $VENV ready (vllm $VERSION, $("$VENV/bin/python" --version))"
